"""What seeing costs: throughput with the stage meters, the bottleneck check and a progress bar
(``progress="always"``, drawn into a file) against the same loader with all of them switched
off (the meters' calls patched to no-ops in this process), in interleaved rounds; plus each
meter call's own cost, timed alone, times the calls a batch makes.

Workload: the 2,000-JPEG folder, the plain user function ``userfns.random_crop``, batch 64,
2 workers, the loader in the trainer's process (so the patch reaches every meter); one epoch
per run, start-up included. Asserts nothing about time.

    python benchmarks/observability.py [--images 2000] [--rounds 7] [--workers 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from userfns import add_folder_args, batch_len, image_folder, random_crop

from aioloader import FileDataset, Loader
from aioloader.engine.sizing import chunk_size
from aioloader.observe.stages import StageMeter
from aioloader.observe.stats import Counters


@contextlib.contextmanager
def meters_off() -> Iterator[None]:
    """Every stage meter call, the per-batch marks and the bottleneck check: no-ops."""
    saved = (StageMeter.enter, StageMeter.leave, Counters._stage_view, Counters.bottleneck)
    StageMeter.enter = lambda self, n=1: 0.0  # type: ignore[method-assign,assignment,misc]
    StageMeter.leave = lambda self, entered, n=1, per=1: None  # type: ignore[method-assign,assignment,misc]
    Counters._stage_view = lambda self, percentiles=True: {}  # type: ignore[method-assign,assignment,misc]
    Counters.bottleneck = lambda self, view=None: None  # type: ignore[method-assign,assignment,misc]
    try:
        yield
    finally:
        StageMeter.enter, StageMeter.leave, Counters._stage_view, Counters.bottleneck = saved  # type: ignore[method-assign]


def epoch(files: FileDataset, workers: int, progress: Any) -> float:
    """Samples/s of one epoch from construction."""
    t0 = time.perf_counter()
    n = 0
    with Loader(files, batch_size=64, decode=random_crop, num_workers=workers, progress=progress) as loader:
        for batch in loader:
            n += batch_len(batch)
    return n / (time.perf_counter() - t0)


def call_cost() -> tuple[float, float]:
    """Seconds per enter+leave pair, and per delivered batch's bookkeeping."""
    meter = StageMeter("read", bound=64)
    n = 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        meter.leave(meter.enter())
    pair = (time.perf_counter() - t0) / n
    counters = Counters(64, 2)
    t0 = time.perf_counter()
    for _ in range(20_000):
        counters.delivered(64, 0.0)
    return pair, (time.perf_counter() - t0) / 20_000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_folder_args(p)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    folder = image_folder(args)
    files = FileDataset.from_folder(folder)
    off: list[float] = []
    on: list[float] = []
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
        epoch(files, args.workers, False)  # warm the page cache and the imports
        for _ in range(args.rounds):
            with meters_off():
                off.append(epoch(files, args.workers, False))
            on.append(epoch(files, args.workers, "always"))
    pair, delivered = call_cost()
    batches = args.images / 64
    chunks = args.images / chunk_size(64, args.workers)  # one decode and one read hop each
    per_epoch = (args.images + chunks + 2 * batches) * pair + batches * delivered
    seconds = args.images / statistics.median(on)
    print(
        f"Command: `{shlex.join(['python', *sys.argv])}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print()
    print("| loader | samples/s (median) | runs |")
    print("|---|---:|---|")
    print(
        f"| meters, bottleneck and bar off | {statistics.median(off):.0f} | {', '.join(f'{x:.0f}' for x in off)} |"
    )
    print(
        f"| all on, progress bar drawn | {statistics.median(on):.0f} | {', '.join(f'{x:.0f}' for x in on)} |"
    )
    print()
    print(f"on / off: {statistics.median(on) / statistics.median(off):.3f}")
    print(
        f"timed alone: {pair * 1e6:.2f} us per meter enter+leave, {delivered * 1e6:.1f} us per delivered "
        f"batch's bookkeeping; about {per_epoch * 1e3:.1f} ms of an epoch's {seconds * 1e3:.0f} ms "
        f"({per_epoch / seconds:.2%}), spread over the loop, the I/O threads and the trainer's thread"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
