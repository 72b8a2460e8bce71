"""Peak memory of a whole epoch: does it grow with the dataset? aioloader (its defaults: a
loader process; and ``loader_process=False``) vs DataLoader.

For each loader and each dataset size (default 2,000 and 20,000 JPEGs of 500x375; the
larger set is copies of the smaller one's files), a fresh
Python process runs one full epoch (``ImageDecoder(224)``, batch 64, shuffled, the same
number of worker processes; the trainer reads a byte of every page of each batch, as a
training step would) while this script, outside that process, samples every 20 ms:

- PSS of the loader's process and all its descendants (worker processes, aioloader's fork
  server), from ``/proc/<pid>/smaps_rollup``. PSS splits each shared page between the
  processes mapping it, so shared memory (slabs, torch's shared tensors) counts once;
- bytes of the slabs made in that process tree (the loader process makes them by default:
  memfd slabs any process of the tree holds, or segments in ``/dev/shm`` with
  ``AIOLOADER_SLABS=devshm``; mapped or not; each once).

The sampling is done from outside the measured process: a thread of the script's own in it
would make aioloader start its zygote clean (see ``aioloader/procs/zygote.py``), not by the
fork a script without threads gets. ``--with-thread`` measures that order on purpose: an idle
Python thread (a TensorBoard writer's, say) started before the loader. ``--forward-first``
runs a model's forward pass before the loader is made, as most training scripts do.

Each peak is given twice: to the process's exit, and while loading (until ``close()``
returned). They differ where the trainer's own teardown at exit writes to pages it shares
with a process forked from it (aioloader's zygote): each such page is then copied, and
the forked process keeps the old one.

The report gives each peak and the 20,000 / 2,000 ratio per loader (1.00 = memory does not
depend on the dataset size), and checks that no ``aioloader-*`` slab is left after
``close()``. Asserts nothing.

    python benchmarks/memory.py [--sizes 2000 20000] [--workers N] [--image-size 500x375] [--with-thread] [--forward-first]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
IN_PROCESS = "aioloader, in-process"
#: DataLoader, aioloader with its defaults (a loader process), and loader_process=False.
LOADERS = ("DataLoader", "aioloader", IN_PROCESS)
sys.path.insert(0, str(HERE))
from userfns import descendants, pss_bytes, touch  # noqa: E402


def shm_bytes(pids: list[int], any_maker: bool = False) -> int:
    """Allocated bytes of the slabs made by any of ``pids`` (the process tree: the loader
    process makes them by default): memfd ones any of them holds, their /dev/shm segments;
    each counted once."""
    sizes = {}
    makers = ("aioloader-",) if any_maker else tuple(f"aioloader-{p}-" for p in pids)
    for name in os.listdir("/dev/shm"):
        if name.startswith(makers):
            try:
                sizes[name] = os.stat(os.path.join("/dev/shm", name)).st_blocks * 512
            except OSError:
                pass
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith(tuple("/memfd:" + m for m in makers)):  # one slab, several fds
                    sizes[link] = os.stat(f"/proc/{pid}/fd/{fd}").st_blocks * 512
            except OSError:
                pass
    return sum(sizes.values())


class Sampler(threading.Thread):
    """Samples the PSS and slab bytes of process ``root`` and its descendants until stopped;
    keeps peaks."""

    def __init__(self, root: int) -> None:
        super().__init__(name="memory-sampler", daemon=True)
        self.root = root
        self.stop = threading.Event()
        self.peak_total = self.peak_main = self.peak_workers = self.peak_shm = 0
        #: ``(time.time(), total PSS)`` of each sample.
        self.totals: list[tuple[float, int]] = []

    def run(self) -> None:
        me = self.root
        while not self.stop.wait(0.02):
            pids = descendants(me)
            main = pss_bytes(me)
            workers = sum(pss_bytes(p) for p in pids if p != me)
            self.peak_main = max(self.peak_main, main)
            self.peak_workers = max(self.peak_workers, workers)
            self.peak_total = max(self.peak_total, main + workers)
            self.totals.append((time.time(), main + workers))
            self.peak_shm = max(self.peak_shm, shm_bytes(pids))


def one(
    loader_name: str, folder: str, workers: int, batch: int, with_thread: bool, forward_first: bool
) -> dict[str, float]:
    """Run one epoch of one loader in this process (the parent samples its memory); returns
    the samples, seconds and slab bytes left after ``close()``."""
    import torch
    from torch.utils.data import DataLoader

    from aioloader import FileDataset, ImageDecoder, Loader

    sys.path.insert(0, str(HERE))
    from userfns import PeerDataset

    files = FileDataset.from_folder(folder)
    decode = ImageDecoder(224)
    if forward_first:  # a model's forward pass before the loader: PyTorch's intra-op threads exist
        torch.nn.Conv2d(3, 8, 3)(torch.randn(4, 3, 64, 64))
    if with_thread:
        threading.Thread(target=threading.Event().wait, name="idle", daemon=True).start()
    start = time.perf_counter()
    samples = 0
    if loader_name == "DataLoader":
        dl = DataLoader(
            PeerDataset(files, decode, takes_rng=False),
            batch_size=batch,
            shuffle=True,
            num_workers=workers,
            generator=torch.Generator().manual_seed(0),
        )
        for _images, labels in dl:
            touch(_images)  # as a training step reads it
            samples += len(labels)
        del dl
    else:
        extra = {"loader_process": False} if loader_name == IN_PROCESS else {}
        with Loader(files, batch_size=batch, decode=decode, num_workers=workers, **extra) as loader:
            for _images, labels in loader:
                touch(_images)
                samples += len(labels)
    seconds = time.perf_counter() - start
    del _images, labels  # the last batch: its mapping of a slab would count as left
    gc.collect()
    left = shm_bytes([os.getpid()], any_maker=True)  # whoever made them
    return {"left": left, "samples": samples, "seconds": seconds, "closed_at": time.time()}


def measured(cmd: list[str]) -> dict[str, float]:
    """Run ``cmd`` (this script's ``--one``) while sampling its process tree; its report
    with the peaks (bytes) added."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    out, _ = proc.communicate()
    sampler.stop.set()
    sampler.join()
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, out)
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    result.update(
        total=sampler.peak_total, main=sampler.peak_main, workers=sampler.peak_workers, shm=sampler.peak_shm
    )
    result["loading"] = max((v for t, v in sampler.totals if t <= result["closed_at"]), default=0)
    return result


def copies(base: Path, n: int) -> Path:
    """A folder of ``n`` distinct files made by copying ``base``'s JPEGs (generating 20,000
    fresh ones takes minutes; for memory only the number of files and their sizes matter)."""
    files = sorted(q for q in base.rglob("*.jpg"))
    if n <= len(files):
        return base
    top = base.parent / f"{n}img_copies_of_{base.name}"
    marker = top / ".complete"
    if marker.is_file():
        return top
    for i in range(n):
        src = files[i % len(files)]
        dst = top / src.parent.name / f"{src.stem}_{i // len(files)}.jpg"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    marker.write_text(str(n))
    return top


def main() -> int:
    from aioloader.config import usable_cpus  # affinity and cgroup CPU quota, as the loader counts

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    p.add_argument("--workers", type=int, default=usable_cpus())
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", default="500x375")
    p.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "aioloader" / "bench")
    p.add_argument(
        "--with-thread", action="store_true", help="an idle thread of the script's before the loader"
    )
    p.add_argument("--forward-first", action="store_true", help="a forward pass before the loader")
    p.add_argument("--one", nargs=2, metavar=("LOADER", "FOLDER"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(
            json.dumps(
                one(
                    args.one[0],
                    args.one[1],
                    args.workers,
                    args.batch_size,
                    args.with_thread,
                    args.forward_first,
                )
            )
        )
        return 0

    from aioloader.synthetic import make_image_folder

    width, height = (int(v) for v in args.image_size.lower().split("x"))
    print(
        f"# memory: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    print(f"# command: python {' '.join(sys.argv)}")
    results: dict[tuple[str, int], dict[str, float]] = {}
    base = args.data_dir / f"{min(args.sizes)}img_10cls_{width}x{height}"
    make_image_folder(base, num_images=min(args.sizes), num_classes=10, size=(width, height))
    for n in args.sizes:
        folder = copies(base, n)
        for name in LOADERS:
            cmd = [sys.executable, __file__, "--one", name, str(folder)]
            cmd += ["--workers", str(args.workers), "--batch-size", str(args.batch_size)]
            cmd += ["--with-thread"] if args.with_thread else []
            cmd += ["--forward-first"] if args.forward_first else []
            results[(name, n)] = measured(cmd)
            print(f"# {name} {n}: done in {results[(name, n)]['seconds']:.1f} s", flush=True)
    mib = 2**20
    print(
        f"\nbatch {args.batch_size}, {args.workers} worker processes each, ImageDecoder(224), one epoch; peaks\n"
    )
    print(
        "| loader | files | peak PSS total MiB, to exit | while loading | main MiB | workers MiB | slabs MiB "
        "| samples/s | slabs left |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (name, n), r in results.items():
        print(
            f"| {name} | {n:,} | {r['total'] / mib:.0f} | {r['loading'] / mib:.0f} | {r['main'] / mib:.0f} | "
            f"{r['workers'] / mib:.0f} | "
            f"{r['shm'] / mib:.0f} | {r['samples'] / r['seconds']:.0f} | {r['left'] / mib:.0f} |"
        )
    lo, hi = min(args.sizes), max(args.sizes)
    print()
    for name in LOADERS:
        a, b = results[(name, lo)], results[(name, hi)]
        print(f"- {name}: peak total at {hi:,} files / at {lo:,} files = {b['total'] / a['total']:.3f}")
    for name in LOADERS[1:]:
        ratio = results[(name, hi)]["total"] / results[("DataLoader", hi)]["total"]
        loading = results[(name, hi)]["loading"] / results[("DataLoader", hi)]["loading"]
        print(
            f"- {name} / DataLoader peak total at {hi:,} files = {ratio:.2f} (while loading: {loading:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
