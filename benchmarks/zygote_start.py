"""How the zygote starts, and what it costs the first batch (issue 32, part 4).

Each case is a fresh trainer process (a script run by this one), in interleaved rounds:

- ``numpy-only``: the trainer imported torch and numpy (OpenBLAS's threads run, and stop
  for a fork), then makes the loader: the zygote is forked;
- ``model-first``: the trainer ran PyTorch's intra-op pool (a model's forward on the CPU:
  threads that do not stop for a fork) before making the loader: the zygote starts clean, a
  fresh interpreter importing what the helpers need;
- ``loader-first``: the same trainer made the loader before the model: the zygote, made
  with the loader, is forked before those threads exist.

Reports how the zygote started, the time from ``with loader`` to the first batch, and to the
end of one epoch. Asserts nothing about time.

    python benchmarks/zygote_start.py [--rounds 3] [--images 512]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = """
import sys, time
import torch, numpy
import aioloader
from aioloader.procs import zygote

def model():
    torch.set_num_threads({threads})
    m = torch.nn.Linear(2000, 2000)
    m(torch.randn(256, 2000))  # PyTorch's intra-op threads now run

ds = aioloader.FileDataset.from_folder({root!r})
if {case!r} == "model-first":
    model()
loader = aioloader.Loader(ds, batch_size=64, decode=aioloader.ImageDecoder(224))
if {case!r} == "loader-first":
    model()
t0 = time.perf_counter()
with loader:
    it = iter(loader)
    next(it)
    t1 = time.perf_counter()
    for _ in it:
        pass
    t2 = time.perf_counter()
print(zygote.started_by(), 1e3 * (t1 - t0), 1e3 * (t2 - t0))
"""

CASES = ("numpy-only", "model-first", "loader-first")


def run_case(case: str, root: Path, threads: int) -> tuple[str, float, float]:
    code = SCRIPT.format(case=case, root=str(root), threads=threads)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True
    )
    how, first, epoch = out.stdout.split()[-3:]
    return how, float(first), float(epoch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=512)
    args = parser.parse_args()
    from aioloader.config import usable_cpus
    from aioloader.synthetic import make_image_folder

    cache = Path(os.environ.get("AIOLOADER_CACHE", Path(tempfile.gettempdir()) / "aioloader-bench"))
    root = make_image_folder(cache / f"zygote_{args.images}img", num_images=args.images, num_classes=4)
    threads = max(2, usable_cpus())
    results: dict[str, list[tuple[str, float, float]]] = {c: [] for c in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            results[case].append(run_case(case, root, threads))
    print(f"- command: python benchmarks/zygote_start.py --rounds {args.rounds} --images {args.images}")
    print(f"- date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}")
    print(
        f"- machine: {os.cpu_count()} CPUs ({usable_cpus()} usable), {platform.processor() or platform.machine()}"
    )
    print(f"- Python {platform.python_version()}; batch 64, ImageDecoder(224), {args.images} JPEGs 500x375")
    print()
    print("| trainer | zygote | first batch ms (median) | one epoch ms (median) |")
    print("|---|---|---:|---:|")
    for case in CASES:
        runs = results[case]
        hows = "/".join(sorted({h for h, _, _ in runs}))
        first = statistics.median(f for _, f, _ in runs)
        epoch = statistics.median(e for _, _, e in runs)
        print(f"| {case} | {hows} | {first:.0f} | {epoch:.0f} |")


if __name__ == "__main__":
    main()
