"""How big a dataset index aioloader can hold: bytes per entry, build time, look-up time.

A 3 TB dataset of ~100 KB files is ~30 M paths. This writes a CSV index of ``--rows`` rows
in an ImageNet-like layout (``train/n01234567/n01234567_000123.JPEG``, 1,000 class folders,
string labels), builds ``FileDataset.from_csv`` from it, and reports:

- memory: the index's own arrays (bytes per entry) and the process's RSS growth, against
  a plain ``list[str]`` of the same paths (measured on a sample and scaled);
- build time (seconds, and rows per second);
- look-up time of ``dataset.path(i)`` and ``dataset.label(i)`` at random ``i``, and one
  epoch's shuffled order (``sampler.epoch_order``).

Asserts nothing; prints a table.

    python benchmarks/index_scale.py [--rows 30000000] [--csv /tmp/index.csv]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import random
import sys
import time

from aioloader import FileDataset
from aioloader.plan.sampler import epoch_order


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def row(i: int, classes: int) -> tuple[str, str]:
    wnid = f"n{1000000 + (i % classes) * 7919:08d}"
    return f"train/{wnid}/{wnid}_{i:09d}.JPEG", wnid


def write_csv(path: str, rows: int, classes: int) -> None:
    chunk = 100_000
    with open(path, "w", encoding="utf-8") as f:
        f.write("path,label\n")
        for start in range(0, rows, chunk):
            f.write(
                "".join("{},{}\n".format(*row(i, classes)) for i in range(start, min(rows, start + chunk)))
            )


def list_bytes_per_entry(rows: int, classes: int, root: str) -> float:
    """What the same paths cost as a ``list[str]`` of absolute paths (a 200k sample)."""
    n = min(rows, 200_000)
    gc.collect()
    before = rss_bytes()
    paths = [os.path.join(root, row(i, classes)[0]) for i in range(n)]
    per = (rss_bytes() - before) / n
    del paths
    return per


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=30_000_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--csv", default="/tmp/aioloader-index-scale.csv")
    parser.add_argument("--lookups", type=int, default=1_000_000)
    args = parser.parse_args()

    print(
        f"# index_scale: {platform.node() and 'host'}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    print(f"# command: python {' '.join(sys.argv)}\n")
    if not (os.path.exists(args.csv) and os.path.getsize(args.csv) > 0 and _rows_in(args.csv) == args.rows):
        t0 = time.perf_counter()
        write_csv(args.csv, args.rows, args.classes)
        print(
            f"wrote {args.csv} ({os.path.getsize(args.csv) / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s\n"
        )
    root = os.path.dirname(os.path.abspath(args.csv))
    per_list = list_bytes_per_entry(args.rows, args.classes, root)

    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    ds = FileDataset.from_csv(args.csv, path_column="path", label_column="label")
    build = time.perf_counter() - t0
    gc.collect()
    grown = rss_bytes() - before
    table = ds.paths
    own = table.nbytes + (ds.labels.nbytes if ds.labels is not None else 0)  # type: ignore[attr-defined]
    n = len(ds)

    idx = [random.randrange(n) for _ in range(args.lookups)]
    t0 = time.perf_counter()
    for i in idx:
        ds.path(i)
    t_path = (time.perf_counter() - t0) / len(idx)
    t0 = time.perf_counter()
    for i in idx:
        ds.label(i)
    t_label = (time.perf_counter() - t0) / len(idx)
    t0 = time.perf_counter()
    order = epoch_order(n, shuffle=True, seed=0, epoch=0)
    t_order = time.perf_counter() - t0
    assert ds.path(int(order[0])).startswith(root)

    print(
        "| rows | classes | index arrays | bytes/entry | RSS growth | RSS bytes/entry | list[str] bytes/entry (est.) | build s | rows/s | path(i) us | label(i) us | epoch order s |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {n:,} | {len(ds.classes or [])} | {own / 2**30:.2f} GiB | {own / n:.1f} | {grown / 2**30:.2f} GiB | "
        f"{grown / n:.1f} | {per_list:.0f} | {build:.1f} | {n / build:,.0f} | {t_path * 1e6:.2f} | {t_label * 1e6:.2f} | "
        f"{t_order:.2f} |"
    )
    print(
        f"\nsample: {ds.path(0)!r} label {ds.label(0)}; 30 M entries at {grown / n:.1f} B/entry = "
        f"{30e6 * grown / n / 2**30:.2f} GiB (vs {30e6 * per_list / 2**30:.2f} GiB as list[str])"
    )
    print(f"epoch order dtype {order.dtype}: {order.nbytes / n:.0f} B/entry while an epoch runs")
    return 0


def _rows_in(path: str) -> int:
    with open(path, "rb") as f:
        return sum(buf.count(b"\n") for buf in iter(lambda: f.read(1 << 24), b"")) - 1


if __name__ == "__main__":
    sys.exit(main())
