"""``io_concurrency="auto"`` against the best fixed setting, as ``aioloader bench --tune``
finds it, with DataLoader beside them in the same run.

For each read latency (0: the page-cached folder, read by the real reader; N: every read
sleeps N ms first, ``userfns.TimedRead``, standing for network storage) it runs
:func:`aioloader.cli.tune.tune`'s sweep ``--rounds`` times: a loader left on ``"auto"`` (both
settings), then ``io_concurrency`` over 8..512 with every usable CPU decoding, then
``num_workers`` at the best of those; each setting for ``--seconds`` after its first batch,
the median of the rounds kept. DataLoader (``num_workers`` = usable CPUs, reading and
decoding in ``__getitem__``) runs for as long once per round. Workload: the 2,000-JPEG
folder, the plain user function ``userfns.random_crop``, batch 64. The decode limit is the
usable CPUs times the single-core decode rate, measured at the start. Asserts nothing
about time.

    python benchmarks/autotune.py [--latency 0,20] [--rounds 3] [--seconds 4]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from typing import Any

from throughput import decode_rate, machine
from torch.utils.data import DataLoader
from userfns import PeerDataset, TimedRead, add_folder_args, batch_len, image_folder, random_crop

from aioloader import FileDataset, Loader
from aioloader.cli.measure import measure
from aioloader.cli.tune import Setting, tune
from aioloader.config import usable_cpus


def dataloader_rate(files: FileDataset, latency_ms: float, seconds: float, workers: int) -> float:
    """DataLoader's samples/s over ``seconds`` after its first batch, as a setting of the
    sweep is measured."""
    read = TimedRead(latency_ms)
    peer = DataLoader(
        PeerDataset(files, random_crop, read=read),
        batch_size=64,
        shuffle=True,
        num_workers=workers,
        persistent_workers=True,
    )
    samples, took, _ = measure(peer, seconds, batch_len, "DataLoader", after_first=True)
    del peer
    return samples / took if took > 0 else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_folder_args(p)
    p.add_argument("--latency", default="0,20", help="ms added to every read, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0, help="per setting, after its first batch")
    args = p.parse_args()
    folder = image_folder(args)
    files = FileDataset.from_folder(folder)
    for i in range(len(files)):  # warm the page cache
        with open(files.path(i), "rb") as f:
            f.read()
    usable = usable_cpus()
    limit = usable * decode_rate(files, random_crop, 3.0)
    print("# io_concurrency='auto' against the best fixed setting")
    print(f"command: python benchmarks/{os.path.basename(__file__)} {shlex.join(sys.argv[1:])}")
    for line in machine():
        print(line)
    print(f"date: {time.strftime('%Y-%m-%d %H:%M')}; decode limit {limit:.0f} samples/s ({usable} CPUs)")
    print()
    print(
        "| read latency | auto (chose io, workers) | best fixed (io, workers) | auto / best "
        "| DataLoader | auto / DataLoader | auto / decode limit |"
    )
    print("|---|---|---|---|---|---|---|")
    sweeps: list[tuple[float, dict[str, Any]]] = []
    for latency in [float(x) for x in args.latency.split(",")]:

        def make(io: Setting, workers: Setting, latency: float = latency) -> Loader:
            return Loader(
                files,
                batch_size=64,
                decode=random_crop,
                io_concurrency=io,
                num_workers=workers,
                read=TimedRead(latency) if latency else None,
            )

        result = tune(make, usable, args.seconds, rounds=args.rounds)
        peer = statistics.median(
            dataloader_rate(files, latency, args.seconds, usable) for _ in range(args.rounds)
        )
        auto, best = result["auto"], result["best"]
        print(
            f"| +{latency:g} ms | {auto['samples_per_s']:.0f} ({auto['chose'][0]}, {auto['chose'][1]}) "
            f"| {best['samples_per_s']:.0f} ({best['io_concurrency']}, {best['num_workers']}) "
            f"| **{result['auto_vs_best']:.2f}** | {peer:.0f} | {auto['samples_per_s'] / peer:.2f}x "
            f"| {auto['samples_per_s'] / limit:.0%} |",
            flush=True,
        )
        sweeps.append((latency, result))
    print()
    for latency, result in sweeps:
        print(f"every setting at +{latency:g} ms (samples/s, median of {args.rounds}):")
        for t in result["trials"]:
            print(
                f"  io_concurrency={t['io_concurrency']!s:>4} num_workers={t['num_workers']!s:>4}: "
                f"{t['samples_per_s']:.0f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
