"""The sample cache (``Loader(cache=aioloader.Cache(...))``, issue 33): its targets measured
side by side in one run, with ``torch.utils.data.DataLoader`` on the same folders as the
peer. Asserts nothing about time; prints a table of runs and one of the targets with their
ratios, and with ``--json OUT`` writes the same figures.

Data, generated once into ``--data-dir`` and reused: set A, ``--files`` JPEGs of 2048x1536
(3 MP, about 1.3 MB each; written by every usable CPU at once); set B, ``--files`` JPEGs of
500x375 (the folder ``throughput.py`` and ``remote.py`` use). The decode is a user's plain
function (``userfns.random_crop``: ``PIL.Image.open``, a RandomResizedCrop-like box resized
to 224, a flip, uint8 CHW); aioloader runs with its defaults (``num_workers=None``,
``io_concurrency="auto"``), batch 64, shuffled. Every run constructs its loader and runs two
epochs; epoch 1's time counts from before the construction (start-up included), epoch 2's
from its first request. A loader run first and not counted makes aioloader's zygote (once
per process), so that no row pays it alone. The trainer reads a byte of every page of each batch, as a step
would.

Cases (each ratio the median over rounds of the ratio within a round):

- a. set A, ``Cache(max_side=512)``: epoch 2 / epoch 1 (target >= 5);
- b. set B, ``Cache(max_side=256)``: epoch 2 / epoch 1 (target >= 1.6);
- c. set B from the aiohttp file server of ``tests/servers.py`` with +``--latency-ms`` per
  request (http URLs), ``Cache()``: its epoch 2 / the local folder's epoch 2 without a
  cache, same round (target >= 0.95);
- d. set B, peak PSS of the whole process tree (the trainer, its loader process, workers;
  ``smaps_rollup`` every 250 ms, a fresh Python process per measurement) with
  ``Cache(max_bytes=M)`` (M: the set's bytes + 10%, so it fits) / (without a cache + M)
  (target <= 1.05);
- e. set B, ``Cache()`` filling: epoch 1 / epoch 1 without a cache (target >= 0.85); and,
  for information, set A with ``Cache(max_side=512)`` against set A without a cache.

DataLoader (``num_workers`` = usable CPUs, ``persistent_workers=True``, a Dataset reading
the file and calling the same function) runs on both folders, epochs 1 and 2. Rounds are
interleaved (``--rounds``); the table shows medians.

    python benchmarks/cache.py [--files 2000] [--rounds 2] [--latency-ms 20] [--json OUT]
                               [--data-dir DIR] [--quick] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from throughput import default_data_dir, loadavg, machine, measure, med
from torch.utils.data import DataLoader
from userfns import PeerDataset, image_folder, random_crop, read_file

from aioloader import Cache, FileDataset, Loader
from aioloader.config import usable_cpus
from aioloader.synthetic import make_image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from servers import control, start_file_server  # noqa: E402

LARGE = (2048, 1536)
MiB = 2**20
DL = "DataLoader"
NO_CACHE = "aioloader, no cache"
SHRINK_A, SHRINK_B = "aioloader, Cache(max_side=512)", "aioloader, Cache(max_side=256)"
MEMORY = "aioloader, Cache()"
#: The sets' rows: (set, loader). "http" is set B from the file server.
ROWS = [
    ("A", DL),
    ("A", NO_CACHE),
    ("A", SHRINK_A),
    ("B", DL),
    ("B", NO_CACHE),
    ("B", SHRINK_B),
    ("B", MEMORY),
    ("http", NO_CACHE),
    ("http", MEMORY),
]
#: case -> (what is measured, comparison, target); None: reported for information.
TARGETS: dict[str, tuple[str, str | None, float | None]] = {
    "a": ("set A (3 MP), Cache(max_side=512): epoch 2 / epoch 1", ">=", 5.0),
    "b": ("set B (500x375), Cache(max_side=256): epoch 2 / epoch 1", ">=", 1.6),
    "c": ("set B over HTTP +L ms, Cache(): epoch 2 / the local folder's epoch 2 without cache", ">=", 0.95),
    "d": ("set B, peak PSS of the whole tree: with Cache(max_bytes=M) / (without + M)", "<=", 1.05),
    "e": ("set B, Cache() filling: epoch 1 / epoch 1 without cache", ">=", 0.85),
    "e-A": ("set A, Cache(max_side=512) filling: epoch 1 / epoch 1 without cache", None, None),
}


def _write_jpeg(job: tuple[str, int, int, int, int]) -> None:
    folder, i, width, height, classes = job
    path = Path(folder) / f"class_{i % classes:02d}" / f"img_{i:06d}.jpg"
    path.parent.mkdir(parents=True, exist_ok=True)
    make_image(np.random.default_rng([7, i]), width, height).save(path, quality=90)


def large_set(data_dir: Path, n: int, size: tuple[int, int] = LARGE) -> Path:
    """``n`` JPEGs of ``size`` in 10 classes under ``data_dir`` (``synthetic.make_image``,
    one generator per image so every usable CPU writes at once), made once, marked by
    ``.complete``."""
    folder = data_dir / f"{n}img_10cls_{size[0]}x{size[1]}_cachebench"
    marker, stamp = folder / ".complete", f"{n} 10 {size[0]}x{size[1]} q90 per-image seeds"
    if marker.is_file() and marker.read_text() == stamp:
        return folder
    t0 = time.perf_counter()
    print(f"# generating {n} JPEGs of {size[0]}x{size[1]} into {folder} (once)", flush=True)
    jobs = [(str(folder), i, *size, 10) for i in range(n)]
    with ProcessPoolExecutor(usable_cpus()) as pool:
        list(pool.map(_write_jpeg, jobs, chunksize=8))
    marker.write_text(stamp)
    print(f"# generated in {time.perf_counter() - t0:.0f} s", flush=True)
    return folder


def warm(files: FileDataset) -> str:
    """Read every file once (the page cache warm for every run alike); a line on the set."""
    sizes = [len(read_file(p)) for p in files.paths]
    return f"{len(files)} JPEGs, {sum(sizes) / len(sizes) / 1e3:.0f} KB mean, {sum(sizes) / MiB:.0f} MiB"


def timed(make: Callable[[], Any], aio: bool) -> dict[str, Any]:
    """One run (``throughput.measure``: construct, two epochs, close): each epoch's
    samples/s (epoch 1 from before the construction) and, for aioloader, its cache as
    epoch 2 left it."""
    made: list[Any] = []

    def keep() -> Any:
        made.append(make())
        return made[-1]

    run = measure(keep, 2, 0.0, set_epoch=aio)
    one, two = run.epochs
    out: dict[str, Any] = {
        "epoch1": one.samples / (run.seconds - two.seconds),
        "epoch2": two.samples / two.seconds,
        "first_batch_s": one.first,
        "samples": [one.samples, two.samples],
    }
    cache = made[0].stats.cache if aio else None
    if cache is not None:
        out.update(hits=cache.epoch_hits, misses=cache.epoch_misses, held=cache.bytes_held)
        out.update(stored=cache.stored, over_bound=cache.over_bound)
    made.clear()
    return out


def memory_one(kind: str, folder: str, max_bytes: int, batch_size: int) -> dict[str, Any]:
    """In a fresh process (``--memory-one``): two epochs of set B with or without
    ``Cache(max_bytes=...)``, the whole tree's PSS sampled; its peak, and the cache."""
    files = FileDataset.from_folder(folder)
    cache = Cache(max_bytes=max_bytes) if kind == "cache" else None
    made: list[Loader] = []

    def make() -> Loader:
        made.append(Loader(files, batch_size=batch_size, decode=random_crop, shuffle=True, cache=cache))
        return made[-1]

    run = measure(make, 2, 0.0, set_epoch=True, memory=True)
    stats = made[0].stats.cache
    return {
        "peak_pss": run.peak_pss,
        "samples": run.samples,
        "held": 0 if stats is None else stats.bytes_held,
        "hits": 0 if stats is None else stats.epoch_hits,
    }


def memory_pair(folder: Path, max_bytes: int, batch_size: int) -> dict[str, dict[str, Any]]:
    """:func:`memory_one` without, then with, the cache: each a fresh Python process."""
    out = {}
    for kind in ("none", "cache"):
        cmd = [sys.executable, __file__, "--memory-one", kind, str(folder), str(max_bytes)]
        done = subprocess.run([*cmd, "--batch-size", str(batch_size)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed:\n{done.stderr[-3000:]}")
        out[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def makers(
    args: argparse.Namespace, sets: dict[str, FileDataset], r: int
) -> list[tuple[str, str, Callable[[], Any]]]:
    """This round's runs in order: per set, DataLoader first (its workers fork before any
    of aioloader's threads exists), then aioloader without and with each cache."""

    def aio(key: str, cache: Cache | None) -> Callable[[], Any]:
        return lambda: Loader(
            sets[key], batch_size=args.batch_size, decode=random_crop, shuffle=True, seed=r, cache=cache
        )

    def peer(key: str) -> Callable[[], Any]:
        return lambda: DataLoader(
            PeerDataset(sets[key], random_crop, read_file, True, r),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=usable_cpus(),
            persistent_workers=True,
            generator=torch.Generator().manual_seed(r),
        )

    caches = {
        NO_CACHE: None,
        SHRINK_A: Cache(max_side=512),
        SHRINK_B: Cache(max_side=256),
        MEMORY: Cache(),
    }
    return [(s, name, peer(s) if name == DL else aio(s, caches[name])) for s, name in ROWS]


def ratios(
    results: dict[tuple[str, str], list[dict[str, Any]]], memory: list[Any], bound: int
) -> dict[str, dict[str, Any]]:
    """Each case's value: the median over rounds of the ratio within a round."""
    per: dict[str, list[float]] = defaultdict(list)
    rounds = len(results["A", DL])
    for r in range(rounds):

        def at(s: str, name: str, epoch: str, r: int = r) -> float:
            return float(results[s, name][r][epoch])

        per["a"].append(at("A", SHRINK_A, "epoch2") / at("A", SHRINK_A, "epoch1"))
        per["b"].append(at("B", SHRINK_B, "epoch2") / at("B", SHRINK_B, "epoch1"))
        per["c"].append(at("http", MEMORY, "epoch2") / at("B", NO_CACHE, "epoch2"))
        per["e"].append(at("B", MEMORY, "epoch1") / at("B", NO_CACHE, "epoch1"))
        per["e-A"].append(at("A", SHRINK_A, "epoch1") / at("A", NO_CACHE, "epoch1"))
    for m in memory:
        per["d"].append(m["cache"]["peak_pss"] / (m["none"]["peak_pss"] + bound))
    cases = {}
    for case, (what, op, target) in TARGETS.items():
        value = med(per[case])
        met = None if target is None else (value >= target if op == ">=" else value <= target)
        cases[case] = {"what": what, "value": round(value, 3), "rounds": per[case], "target": target}
        cases[case].update(op=op, met=met)
    return cases


def print_runs(results: dict[tuple[str, str], list[dict[str, Any]]]) -> None:
    print(
        "| set | loader | epoch 1 samples/s (start-up included) | epoch 2 samples/s | epoch 2 / epoch 1 "
        "| epoch 2 vs DataLoader's epoch 2 | first batch ms | epoch 2 hits / misses | cache held MiB |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for s, name in ROWS:
        rs = results[s, name]
        e1, e2 = med(x["epoch1"] for x in rs), med(x["epoch2"] for x in rs)
        peer = results.get(("B" if s == "http" else s, DL))
        vs = f"{e2 / med(x['epoch2'] for x in peer):.2f}x" if peer else "n/a"
        hits = (
            f"{med(x['hits'] for x in rs):.0f} / {med(x['misses'] for x in rs):.0f}"
            if "hits" in rs[0]
            else "-"
        )
        held = f"{med(x['held'] for x in rs) / MiB:.1f}" if "held" in rs[0] else "-"
        print(
            f"| {s} | {name} | {e1:.0f} | {e2:.0f} | {e2 / e1:.2f} | {vs} "
            f"| {med(x['first_batch_s'] for x in rs) * 1e3:.0f} | {hits} | {held} |"
        )


def print_cases(cases: dict[str, dict[str, Any]], memory: list[Any], bound: int, latency: float) -> None:
    print("| case | measured | value | target | met |")
    print("|---|---|---:|---:|---|")
    for case, c in cases.items():
        what = c["what"].replace("+L ms", f"+{latency:g} ms")
        if case == "d":
            without = med(m["none"]["peak_pss"] for m in memory) / MiB
            with_ = med(m["cache"]["peak_pss"] for m in memory) / MiB
            held = med(m["cache"]["held"] for m in memory) / MiB
            what += f" (without {without:.0f} MiB, with {with_:.0f} MiB, M {bound / MiB:.0f} MiB, held {held:.0f} MiB)"
        target = "information" if c["target"] is None else f"{c['op']} {c['target']:g}"
        met = "-" if c["met"] is None else ("yes" if c["met"] else "**no**")
        print(f"| {case} | {what} | {c['value']:.2f} | {target} | {met} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=default_data_dir(), help="(%(default)s)")
    p.add_argument("--files", type=int, default=None, help="JPEGs per set (2000; 200 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (2; 1 with --quick)")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added to each HTTP request (%(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="(%(default)s)")
    p.add_argument("--json", metavar="OUT", type=Path, default=None, help="also write the figures to OUT")
    p.add_argument("--quick", action="store_true", help="a smoke check: 200 files per set, 1 round")
    p.add_argument("--memory-one", nargs=3, metavar=("KIND", "FOLDER", "MAX_BYTES"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.files = args.files or (200 if args.quick else 2000)
    args.rounds = args.rounds or (1 if args.quick else 2)
    if min(args.files, args.rounds, args.batch_size) < 1 or args.latency_ms < 0:
        p.error("--files, --rounds and --batch-size must be positive, --latency-ms at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.memory_one:
        kind, folder, bound = args.memory_one
        print(json.dumps(memory_one(kind, folder, int(bound), args.batch_size)))
        return 0
    load_start = loadavg()
    folders = {
        "A": large_set(args.data_dir, args.files),
        "B": image_folder(argparse.Namespace(data_dir=args.data_dir, images=args.files)),
    }
    sets = {k: FileDataset.from_folder(f) for k, f in folders.items()}
    lines = {k: warm(files) for k, files in sets.items()}
    bound = int(sum(os.path.getsize(p) for p in sets["B"].paths) * 1.1)
    server = start_file_server(folders["B"])
    try:
        control(server.url, latency_ms=args.latency_ms)
        rel = [os.path.relpath(p, folders["B"]) for p in sets["B"].paths]
        sets["http"] = FileDataset(
            [f"{server.url}/{x}" for x in rel], sets["B"].labels, classes=sets["B"].classes
        )
        results: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        memory: list[dict[str, dict[str, Any]]] = []
        # Not counted: the first loader of a process makes aioloader's zygote (once per
        # process), which no row should pay alone.
        few = FileDataset(list(sets["B"].paths)[: 2 * args.batch_size])
        timed(lambda: Loader(few, batch_size=args.batch_size, decode=random_crop), True)
        for r in range(args.rounds):
            for s, name, make in makers(args, sets, r):
                res = timed(make, name != DL)
                results[s, name].append(res)
                print(
                    f"# round {r + 1}/{args.rounds} {s} {name}: epoch 1 {res['epoch1']:.0f}, "
                    f"epoch 2 {res['epoch2']:.0f} samples/s",
                    flush=True,
                )
            memory.append(memory_pair(folders["B"], bound, args.batch_size))
            print(
                f"# round {r + 1}/{args.rounds} memory: peak PSS without {memory[-1]['none']['peak_pss'] / MiB:.0f} "
                f"MiB, with Cache(max_bytes={bound / MiB:.0f} MiB) {memory[-1]['cache']['peak_pss'] / MiB:.0f} MiB",
                flush=True,
            )
    finally:
        server.stop()
    cases = ratios(results, memory, bound)
    report(args, lines, folders, results, memory, cases, bound, (load_start, loadavg()))
    return 0


def report(
    args: argparse.Namespace,
    lines: dict[str, str],
    folders: dict[str, Path],
    results: dict[tuple[str, str], list[dict[str, Any]]],
    memory: list[dict[str, dict[str, Any]]],
    cases: dict[str, dict[str, Any]],
    bound: int,
    load: tuple[str, str],
) -> None:
    """The tables on stdout; with ``--json``, the figures in that file."""
    command = shlex.join([os.path.basename(sys.executable), *sys.argv])
    about = machine()
    print()
    print(f"Command: `{command}`")
    print()
    print("\n".join(about))
    print(f"- set A: {lines['A']}, 2048x1536, in {folders['A']}")
    print(f"- set B: {lines['B']}, 500x375, in {folders['B']}; http: the same from tests/servers.py's file")
    print(f"  server on 127.0.0.1, +{args.latency_ms:g} ms per request")
    print(
        f"- decode userfns.random_crop (a plain function); batch {args.batch_size}, shuffled; aioloader "
        f"defaults (num_workers=None, io_concurrency='auto'); DataLoader num_workers={usable_cpus()} "
        "(usable CPUs), persistent_workers=True"
    )
    print(
        f"- each run: construct, two epochs, close; epoch 1 from before the construction; medians of "
        f"{args.rounds} interleaved rounds; 1-min load average at start {load[0]}, at end {load[1]}"
    )
    print()
    print_runs(results)
    print()
    print_cases(cases, memory, bound, args.latency_ms)
    if args.json is not None:
        out = {
            "command": command,
            "machine": about,
            "sets": {k: {"folder": str(folders[k]), "files": lines[k]} for k in folders},
            "latency_ms": args.latency_ms,
            "rounds": args.rounds,
            "batch_size": args.batch_size,
            "runs": {f"{s} | {name}": results[s, name] for s, name in ROWS},
            "memory": {"max_bytes": bound, "rounds": memory},
            "cases": cases,
        }
        args.json.write_text(json.dumps(out, indent=1))
        print(f"\nfigures written to {args.json}")


if __name__ == "__main__":
    sys.exit(main())
