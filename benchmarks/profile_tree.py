"""Where the whole process tree spends CPU per image: the trainer, aioloader's zygote,
loader process and decode workers (or DataLoader's workers), by process and thread, and
what of it is the decode itself.

A child Python process (so nothing else of this script is in its tree) constructs the
loader with the settings under test, runs ``--epochs`` epochs of a plain user decode
function (``userfns.random_crop``, nothing declared) and, before ``close()``, reads every
live process's and thread's user+sys CPU from ``/proc`` (exact, no profiler). The decode's
own cost is measured in that child first, on one core, on bytes in memory, then in as many
processes at once as there are usable CPUs (CPU per image: the floor under any loader that
keeps every core decoding); a worker's *overhead* is its CPU minus the decode's cost times
the samples it decoded (the workers together decode every sample once).

With ``--py-spy``, the same run again under ``py-spy record --subprocesses --native``
(``--rate`` Hz), printing each process role's top leaf functions by share of its samples
(idle samples left out): where the loader's own CPU goes.

    python benchmarks/profile_tree.py [--loader auto,off,on,dataloader] [--images 2000]
                                      [--epochs 2] [--py-spy] [--rate 250] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, {here!r})
import numpy as np, torch
from torch.utils.data import DataLoader
from userfns import PeerDataset, batch_len, random_crop, read_file
from aioloader import FileDataset, Loader

files = FileDataset.from_folder({folder!r})
data = [read_file(files.path(i)) for i in range(200)]
rng = np.random.default_rng(0)
for d in data[:10]:
    random_crop(d, rng)
n, t = 0, time.perf_counter()
while time.perf_counter() - t < 3.0:
    random_crop(data[n % 200], rng); n += 1
decode_s = (time.perf_counter() - t) / n

# The same decode in every usable CPU at once (forked now, before any loader thread): its
# CPU per image is the floor under any loader that keeps every core decoding, as two decodes
# at once are each slower than one alone (shared caches, memory bandwidth, SMT siblings).
ways = len(os.sched_getaffinity(0))
pipes = []
for k in range(ways):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        m, c, t = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - t < 3.0:
            random_crop(data[(m + 37 * k) % 200], rng); m += 1
        os.write(w, json.dumps([m, time.process_time() - c]).encode())
        os._exit(0)
    os.close(w)
    pipes.append(r)
done = [json.loads(os.read(r, 200)) for r in pipes]
for r in pipes:
    os.close(r)
    os.wait()
together_s = sum(c for _, c in done) / sum(m for m, _ in done)

def cpu_of(path):
    with open(path) as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / {tick}

import threading
names = {{}}
before_p, before_t = {{}}, {{}}

def tree():
    for t in threading.enumerate():
        names[t.native_id] = t.name
    kids = {{}}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{{name}}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(name))
    out, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop(); out.append(pid); todo.extend(kids.get(pid, []))
    procs = []
    for pid in out:
        try:
            comm = open(f"/proc/{{pid}}/comm").read().strip()
            threads = {{}}
            for tid in os.listdir(f"/proc/{{pid}}/task"):
                tcomm = names.get(int(tid)) if pid == os.getpid() else None
                tcomm = tcomm or open(f"/proc/{{pid}}/task/{{tid}}/comm").read().strip()
                tcomm = tcomm.rstrip("0123456789_-")
                threads[tcomm] = threads.get(tcomm, 0.0) + cpu_of(f"/proc/{{pid}}/task/{{tid}}/stat") - before_t.get(int(tid), 0.0)
            procs.append({{"pid": pid, "comm": comm, "cpu": cpu_of(f"/proc/{{pid}}/stat") - before_p.get(pid, 0.0), "threads": threads}})
        except OSError:
            pass
    return procs

mode = {mode!r}
before_p = {{os.getpid(): cpu_of("/proc/self/stat")}}
before_t = {{int(t): cpu_of(f"/proc/self/task/{{t}}/stat") for t in os.listdir("/proc/self/task")}}
t0 = time.perf_counter()
if mode == "dataloader":
    loader = DataLoader(PeerDataset(files, random_crop), batch_size=64, shuffle=True,
                        num_workers=len(os.sched_getaffinity(0)), persistent_workers=True)
else:
    kw = {{}} if mode == "auto" else {{"loader_process": mode == "on"}}
    loader = Loader(files, batch_size=64, decode=random_crop, shuffle=True, **kw)
samples = 0
for e in range({epochs}):
    if mode != "dataloader":
        loader.set_epoch(e)
    for b in loader:
        samples += batch_len(b)
wall = time.perf_counter() - t0
procs = tree()
runtime = getattr(getattr(loader, "_runtime", None), "__class__", type(None)).__name__
if mode != "dataloader":
    loader.close()
print("RESULT " + json.dumps({{"decode_s": decode_s, "together_s": together_s, "ways": ways, "samples": samples, "wall": wall, "procs": procs, "runtime": runtime}}))
"""


def role(comm: str, pid: int, root: int, mode: str) -> str:
    if pid == root:
        return "trainer"
    if comm.startswith("aioloader-"):
        return {
            # earlier names, cut by the kernel, in profiles recorded before they changed
            "aioloader-worke": "aioloader-work",
            "aioloader-zygot": "aioloader-fork",
            "aioloader-loade": "aioloader-loop",
        }.get(comm, comm)
    if comm == "py-spy":
        return "py-spy"
    return "DataLoader worker" if mode == "dataloader" else comm


def run_child(mode: str, folder: str, epochs: int, spy: tuple[int, str] | None, native: bool = False) -> dict:
    code = CHILD.format(here=str(HERE), folder=folder, tick=TICK, mode=mode, epochs=epochs)
    script = Path(tempfile.mkdtemp()) / "profile_tree_child.py"  # py-spy names processes by command line
    script.write_text(code)
    cmd = [sys.executable, str(script)]
    if spy is not None:
        rate, out = spy
        cmd = [
            "py-spy",
            "record",
            "--subprocesses",
            *(["--native"] if native else []),
            "-r",
            str(rate),
            "-f",
            "raw",
            "-o",
            out,
            "--",
            *cmd,
        ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{mode}: no result\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def report_cpu(mode: str, res: dict) -> list[str]:
    n = res["samples"]
    procs = res["procs"]
    root = procs[0]["pid"]
    by_role: dict[str, float] = defaultdict(float)
    threads: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for p in procs:
        r = role(p["comm"], p["pid"], root, mode)
        if r == "py-spy":
            continue
        by_role[r] += p["cpu"]
        for t, c in p["threads"].items():
            threads[r][t] += c
    total = sum(by_role.values())
    decode = res["decode_s"] * n
    lines = [
        f"### {mode} (runtime {res['runtime']}): {n} samples in {res['wall']:.2f} s "
        f"({n / res['wall']:.0f}/s); decode alone {res['decode_s'] * 1e3:.3f} ms/image on one core",
        "",
        f"machine CPU {total / n * 1e3:.3f} ms/image, overhead {(total - decode) / n * 1e3:.3f} ms/image "
        "(machine CPU minus the decode's one-core cost)",
        "",
        f"the decode alone in {res['ways']} processes at once: {res['together_s'] * 1e3:.3f} ms/image of CPU "
        f"(+{(res['together_s'] - res['decode_s']) * 1e3:.3f} over one alone: the floor of any loader's overhead "
        f"on this machine); the loader's own cost above that floor: {(total / n - res['together_s']) * 1e3:.3f} ms/image",
        "",
        "| process | processes | CPU ms/image | of which threads (ms/image) |",
        "|---|---:|---:|---|",
    ]
    counts = Counter(role(p["comm"], p["pid"], root, mode) for p in procs)
    for r, cpu in sorted(by_role.items(), key=lambda kv: -kv[1]):
        parts = ", ".join(
            f"{t} {c / n * 1e3:.3f}"
            for t, c in sorted(threads[r].items(), key=lambda kv: -kv[1])
            if c / n >= 5e-6
        )
        lines.append(f"| {r} | {counts[r]} | {cpu / n * 1e3:.3f} | {parts} |")
    workers = sum(c for r, c in by_role.items() if r in ("aioloader-work", "DataLoader worker"))
    lines += [
        "",
        f"decode workers' overhead (their CPU minus the decode): {(workers - decode) / n * 1e3:.3f} ms/image",
        "",
    ]
    return lines


def report_spy(raw: str, res: dict, mode: str, top: int) -> list[str]:
    """Leaf-function shares per process role from py-spy's raw (collapsed) output; idle
    threads are not sampled (py-spy without ``--idle``)."""
    root = res["procs"][0]["pid"]
    roles = {p["pid"]: role(p["comm"], p["pid"], root, mode) for p in res["procs"]}
    per: dict[str, Counter[str]] = defaultdict(Counter)
    inclusive: dict[str, Counter[str]] = defaultdict(Counter)
    for line in Path(raw).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or not stack.startswith("process "):
            continue
        frames = stack.split(";")
        # A child's stack follows its parents' "process PID:cmdline" frames: the last names it.
        at = max(i for i, f in enumerate(frames) if f.startswith("process "))
        pid = int(frames[at].split()[1].split(":")[0])
        frames = frames[at:]
        # The leaf, with its Python caller when the leaf is native code.
        py = [f for f in frames[1:] if ".py:" in f]
        leaf = frames[-1] if ".py:" in frames[-1] or not py else f"{frames[-1]} <- {py[-1]}"
        who = roles.get(pid, f"pid {pid} (gone before the snapshot)")
        per[who][leaf] += int(count)
        for f in {
            f
            for f in frames
            if "aioloader/" in f or "userfns.py" in f or "concurrent/" in f or "multiprocessing/" in f
        }:
            inclusive[who][f] += int(count)
    lines = []
    for proc, c in sorted(per.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(c.values())
        lines.append(f"#### py-spy: {proc} ({total} busy samples)")
        lines.append("leaf functions (own time):")
        for leaf, k in c.most_common(top):
            lines.append(f"- {k / total:5.1%} {leaf}")
        lines.append(
            "inclusive (the function and what it calls), aioloader, the user's decode, concurrent, multiprocessing:"
        )
        for f, k in inclusive[proc].most_common(top):
            lines.append(f"- {k / total:5.1%} {f}")
        lines.append("")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loader", default="auto,off,on,dataloader")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--py-spy", action="store_true")
    p.add_argument("--rate", type=int, default=250)
    p.add_argument(
        "--native", action="store_true", help="py-spy --native (C frames; idle detection is weaker)"
    )
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    sys.path.insert(0, str(HERE))
    from throughput import default_data_dir

    from aioloader.synthetic import make_image_folder

    folder = default_data_dir() / f"{args.images}img_10cls_500x375"
    make_image_folder(folder, num_images=args.images, num_classes=10, size=(500, 375))
    lines = [
        "# profile_tree: CPU per image of the whole process tree, by process and thread",
        f"# command: python benchmarks/profile_tree.py {' '.join(sys.argv[1:])}",
        f"# date (UTC): {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}; {os.cpu_count()} CPUs; "
        f"1-min load {os.getloadavg()[0]:.2f} at start",
        f"# workload: {args.images} JPEGs 500x375, userfns.random_crop, batch 64, {args.epochs} epochs, "
        "start-up included, default settings (io_concurrency='auto', num_workers=None)",
        "",
    ]
    for mode in args.loader.split(","):
        lines += report_cpu(mode, run_child(mode, str(folder), args.epochs, None))
        if args.py_spy and shutil.which("py-spy"):
            with tempfile.TemporaryDirectory() as tmp:
                raw = os.path.join(tmp, "raw.txt")
                res = run_child(mode, str(folder), args.epochs, (args.rate, raw), args.native)
                lines += report_spy(raw, res, mode, args.top)
        print("\n".join(lines), flush=True)
    out = args.out or str(HERE / "profiles" / f"tree_cpu_{time.strftime('%Y-%m-%d')}.txt")
    Path(out).write_text("\n".join(lines) + "\n")
    print(f"# written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
