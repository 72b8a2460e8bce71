"""The first batch in the orders of calls users write, aioloader against DataLoader
(issue 32, part 4; issue 41, item 1).

Each case is a fresh trainer process (a script run by this one), in interleaved rounds, each
order run once with aioloader's defaults and once with ``DataLoader(num_workers=2)`` over the
same files and decode (``ImageDecoder(224)``, batch 64):

- ``numpy-only``: torch and numpy imported (OpenBLAS's threads run, and stop for a fork),
  then the loader;
- ``loader-first``: the loader made, then the model built and run once, then the loop (the
  time counts from ``with loader`` / ``iter(loader)``);
- ``model-first``: the model built (its weights initialised), no forward pass, then the loader;
- ``forward-first``: the model built and run once on the CPU (PyTorch's intra-op threads
  run), then the loader;
- ``threads-first``: two Python threads started before anything is imported (as in a
  process whose framework starts threads: a server, a launcher), then the loader;
- ``notebook``: a real Jupyter kernel (ipykernel, driven by nbclient: its heartbeat, I/O,
  control and shell-channel threads, libzmq's) runs the same code as one cell: torch and
  aioloader imported, the model built and run once, then the loader. "From launch" is from
  the cell's start there.

Each script imports its loader at its top, as scripts do. Except in ``loader-first``, the
first batch's time counts from the loader's construction (aioloader starts its zygote there);
"from launch" counts from the moment this process started the script (imports included:
``import aioloader`` is aioloader's, torch's is both's). Reports how the zygote started, the
ratio aioloader / DataLoader of the first batch's time, and one epoch's time. Asserts
nothing about time.

    python benchmarks/zygote_start.py [--rounds 3] [--images 512] [--cases forward-first,...]
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
import time
from pathlib import Path

SCRIPT = """
import sys, threading, time
sys.path.insert(0, {bench!r})
case = {case!r}
if case == "threads-first":
    stop = threading.Event()
    for name in ("heartbeat", "iopub"):
        threading.Thread(target=stop.wait, name=name, daemon=True).start()
import torch, numpy
import aioloader
from aioloader.procs import zygote
if {kind!r} == "aioloader":
    from aioloader import Loader  # as a script imports it: at its top
else:
    from torch.utils.data import DataLoader
    from userfns import PeerDataset

def model():
    torch.set_num_threads({threads})
    return torch.nn.Sequential(torch.nn.Linear(2000, 2000), torch.nn.ReLU(), torch.nn.Linear(2000, 10))

def forward(m):
    m(torch.randn(256, 2000))  # PyTorch's intra-op threads now run

def make():
    if {kind!r} == "aioloader":
        return Loader(ds, batch_size=64, decode=aioloader.ImageDecoder(224))
    return DataLoader(PeerDataset(ds, aioloader.ImageDecoder(224), takes_rng=False), batch_size=64,
                      shuffle=True, num_workers=2)

ds = aioloader.FileDataset.from_folder({root!r})
if case in ("model-first", "forward-first", "notebook"):
    m = model()
    if case != "model-first":
        forward(m)
t0 = time.perf_counter()
loader = make()
if case == "loader-first":
    forward(model())
    t0 = time.perf_counter()
it = iter(loader.__enter__() if hasattr(loader, "__enter__") else loader)
next(it)
t1 = time.perf_counter()
for _ in it:
    pass
t2 = time.perf_counter()
if hasattr(loader, "close"):
    loader.close()
launch = 1e3 * (time.time() - {launched!r}) - 1e3 * (time.perf_counter() - t1)
print(zygote.started_by() if {kind!r} == "aioloader" else "-", 1e3 * (t1 - t0), 1e3 * (t2 - t0), launch)
"""

#: Runs a cell in a fresh Jupyter kernel of this interpreter and prints what it printed.
NOTEBOOK = """
import nbformat
from nbclient import NotebookClient
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell({cell!r})]
NotebookClient(nb, timeout=600, kernel_name="python3").execute()
print("".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("name") == "stdout"))
"""

CASES = ("numpy-only", "loader-first", "model-first", "forward-first", "threads-first", "notebook")
KINDS = ("DataLoader", "aioloader")


def run_case(case: str, kind: str, root: Path, threads: int) -> tuple[str, float, float, float]:
    bench = str(Path(__file__).resolve().parent)
    launched = time.time()
    code = SCRIPT.format(
        case=case, kind=kind, root=str(root), threads=threads, bench=bench, launched=launched
    )
    if case == "notebook":
        cell = "import time\n_launched = time.time()\n" + code.replace(repr(launched), "_launched")
        code = NOTEBOOK.format(cell=cell)
    # Run outside the checkout: ``-c`` puts the working directory first on sys.path, and
    # PYTHONPATH must choose which aioloader is measured.
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True, cwd=root.parent
    )
    how, first, epoch, script = out.stdout.split()[-4:]
    return how, float(first), float(epoch), float(script)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    args = parser.parse_args()
    from aioloader.config import usable_cpus
    from aioloader.synthetic import make_image_folder

    cases = [c for c in args.cases.split(",") if c]
    cache = Path(os.environ.get("AIOLOADER_CACHE", Path(tempfile.gettempdir()) / "aioloader-bench"))
    root = make_image_folder(cache / f"zygote_{args.images}img", num_images=args.images, num_classes=4)
    threads = max(2, usable_cpus())
    results: dict[tuple[str, str], list[tuple[str, float, float, float]]] = {
        (c, k): [] for c in cases for k in KINDS
    }
    for r in range(args.rounds):
        for case in cases:
            # Alternate which loader goes first in a round: neither always meets a cold cache.
            for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
                results[case, kind].append(run_case(case, kind, root, threads))
    print(f"- command: python benchmarks/zygote_start.py --rounds {args.rounds} --images {args.images}")
    print(f"- date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}")
    print(
        f"- machine: {os.cpu_count()} CPUs ({usable_cpus()} usable), {platform.processor() or platform.machine()}"
    )
    print(f"- Python {platform.python_version()}; batch 64, ImageDecoder(224), {args.images} JPEGs 500x375")
    print()
    print(
        "| trainer | zygote | first batch ms: DataLoader | aioloader | ratio | from launch ms: DataLoader | aioloader "
        "| epoch ms: DataLoader | aioloader |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        peer, ours = results[case, "DataLoader"], results[case, "aioloader"]
        hows = "/".join(sorted({h for h, *_ in ours}))
        first, launch, epoch = (
            [statistics.median(x[i] for x in runs) for runs in (peer, ours)] for i in (1, 3, 2)
        )
        cells = [*first, first[1] / first[0], *launch, *epoch]
        print(
            f"| {case} | {hows} | " + " | ".join(f"{c:.2f}" if c < 10 else f"{c:.0f}" for c in cells) + " |"
        )


if __name__ == "__main__":
    main()
