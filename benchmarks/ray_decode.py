"""``decode_on="ray"`` on one node: against the local loader and Ray Data, in one run, and
where the trainer node's CPU goes. Asserts nothing about time.

Workload (as ``throughput.py``): the generated ImageFolder of JPEGs (default 2,000 at
500x375, about 85 KB each), decoded by ``userfns.random_crop`` (a plain user function:
Pillow decode, a random box resized to 224x224, flip; uint8 CHW), batch 64, shuffled.
Loaders, each measured from its construction through ``--epochs`` epochs (start-up
included), ``--rounds`` interleaved rounds, medians:

- ``aioloader, local``: ``Loader(decode=random_crop)`` with the defaults (the reference);
- ``aioloader, decode_on="ray"``: the same loader decoding as Ray tasks on a one-node Ray
  cluster of ``--cpus`` CPUs (``ray.init(num_cpus=...)``, started once by this script, before
  the first round; its start is reported apart);
- ``Ray Data``: ``ray.data.read_binary_files(paths, shuffle="files")`` ->
  ``map_batches(random_crop on each row's bytes, batch_format="numpy", batch_size=64)`` ->
  ``iter_torch_batches(batch_size=64)``, on the same cluster;
- ``DataLoader`` (``--torch``, default on): ``num_workers=--cpus`` reading and decoding the
  same files, ``persistent_workers=True``;
- ``decode_on="ray", chunk K`` (``--chunks``, default 8,64): the Ray path with K samples per
  task instead of the engine's choice (``engine.epoch.cluster_chunk`` (from ``cluster.stage``) replaced for that run
  only), so the trainer's CPU can be split into a cost per task and one per sample: the
  engine picks 16 on this 2-CPU cluster but 8 on any cluster of 4 tasks or more at batch 64.

CPU, from ``/proc`` over each run: the trainer's process (this one, all its threads:
``utime+stime`` of ``/proc/self/stat``; with ``decode_on="ray"`` the loader runs in it), and
every process under it by kind, found by command line (``utime+stime+cutime+cstime``, so a
worker reaped by its parent still counts): Ray's workers (``ray::``/``default_worker.py``),
the raylet, the GCS, Ray's other daemons (dashboard agent, log monitor, runtime-env agent),
and the loaders' own processes (aioloader's zygote, loader process and decode workers;
DataLoader's workers). The Ray cluster is the script's child, so another Ray cluster on the
machine is not counted. The idle cluster's daemons run during every loader's run, so each
row shows what they cost.

Then a scaling estimate on paper from the measured costs: the trainer's CPU per sample on
the Ray path (its one core's limit: the loader's loop holds the GIL), the bytes per sample
crossing the trainer's NIC (the file out, the decoded sample in), and the cluster's CPU per
sample, for N nodes of C cores.

    python benchmarks/ray_decode.py [--images 2000] [--rounds 3] [--batch-size 64] [--cpus N]
                                    [--epochs 2] [--torch on|off] [--chunks 8,64] [--nodes-cores 16]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import shlex
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from throughput import decode_rate, default_data_dir, loadavg, machine, med, stop_fork_server
from torch.utils.data import DataLoader
from userfns import PeerDataset, batch_len, random_crop, read_file

import aioloader.engine.epoch as engine_epoch
from aioloader import FileDataset, Loader
from aioloader.config import usable_cpus
from aioloader.synthetic import make_image_folder

LOCAL = "aioloader, local (defaults)"
RAY = 'aioloader, decode_on="ray"'
RAY_DATA = "Ray Data"
TORCH = "DataLoader"
#: The kinds of process the CPU is split into, in report order.
KINDS = ("trainer", "ray workers", "raylet", "gcs", "ray other", "loader processes")
_TICK = os.sysconf("SC_CLK_TCK")
#: Bytes of one decoded sample: 3x224x224 uint8.
DECODED_BYTES = 3 * 224 * 224


def crop_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Ray Data's ``map_batches`` function: the same decode on each row's bytes."""
    rng = np.random.default_rng()
    return {"image": np.stack([random_crop(bytes(b), rng) for b in batch["bytes"]])}


# --- CPU from /proc ----------------------------------------------------------------------------


def _stat(pid: int | str) -> tuple[int, float, float] | None:
    """(ppid, utime+stime, utime+stime+cutime+cstime) in seconds, or None for a process gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    own = (int(fields[11]) + int(fields[12])) / _TICK
    return int(fields[1]), own, own + (int(fields[13]) + int(fields[14])) / _TICK


def kind_of(pid: int) -> str:
    """The kind of one of this process's descendants, by its command line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "loader processes"
    if "raylet" in cmd:
        return "raylet"
    if "gcs_server" in cmd:
        return "gcs"
    if cmd.startswith("ray::") or "default_worker.py" in cmd:
        return "ray workers"
    if "/ray/" in cmd or cmd.startswith("ray_"):  # dashboard agent, log monitor, runtime env agent
        return "ray other"
    return "loader processes"


def cpu_snapshot() -> dict[int, tuple[str, float]]:
    """CPU seconds by pid: this process (``trainer``: its own threads only, from
    ``/proc/self/stat``) and each descendant with its kind (its reaped children included)."""
    me = os.getpid()
    stats: dict[int, tuple[int, float, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            got = _stat(name)
            if got is not None:
                stats[int(name)] = got
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, _, _) in stats.items():
        children[ppid].append(pid)
    out = {me: ("trainer", stats[me][1])}
    todo = list(children[me])
    while todo:
        pid = todo.pop()
        out[pid] = (kind_of(pid), stats[pid][2])
        todo.extend(children[pid])
    return out


def cpu_since(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds by kind since ``before`` (a process born since counts whole)."""
    out = dict.fromkeys(KINDS, 0.0)
    for pid, (kind, cpu) in cpu_snapshot().items():
        out[kind] += cpu - before.get(pid, (kind, 0.0))[1]
    return out


# --- one run -----------------------------------------------------------------------------------


@dataclass
class Run:
    seconds: float  # construction to the end of the last epoch
    samples: int
    first: float  # construction to the first batch
    cpu: dict[str, float]  # seconds by kind, same span
    cluster: Any = None  # decode_on="ray": loader.stats.cluster at the end
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds

    def per_sample_ms(self, kind: str) -> float:
        return self.cpu[kind] / self.samples * 1e3


def measure(make: Callable[[], Any], epochs: Callable[[Any, int], Iterable[Any]], n: int) -> Run:
    """Construct with ``make()``, iterate ``epochs(obj, e)`` for ``n`` epochs, close."""
    gc.collect()
    before = cpu_snapshot()
    t0 = time.perf_counter()
    obj = make()
    first: float | None = None
    samples = 0
    cluster = None
    try:
        for e in range(n):
            for batch in epochs(obj, e):
                if first is None:
                    first = time.perf_counter() - t0
                samples += batch_len(batch)
        seconds = time.perf_counter() - t0
        cpu = cpu_since(before)
        if isinstance(obj, Loader):
            cluster = obj.stats.cluster
    finally:
        if isinstance(obj, Loader):
            obj.close()
            stop_fork_server()
        del obj
        gc.collect()
    return Run(seconds, samples, first or 0.0, cpu, cluster)


def loader_epochs(loader: Loader, e: int) -> Iterator[Any]:
    loader.set_epoch(e)
    return iter(loader)


def ray_data_epochs(ds: Any, e: int) -> Iterator[Any]:
    return iter(ds.iter_torch_batches(batch_size=ARGS.batch_size))


def torch_epochs(dl: Any, e: int) -> Iterator[Any]:
    return iter(dl)


@contextmanager
def chunk_of(k: int | None) -> Iterator[None]:
    """The engine's samples per decode task forced to ``k`` (None: its own choice)."""
    own = engine_epoch.cluster_chunk
    if k is not None:
        engine_epoch.cluster_chunk = lambda batch_size, tasks: k  # type: ignore[assignment]
    try:
        yield
    finally:
        engine_epoch.cluster_chunk = own  # type: ignore[assignment]


# --- report -------------------------------------------------------------------------------------


def print_table(runs: dict[str, list[Run]], order: list[str], cores: int, rate1: float) -> None:
    local = med(r.rate for r in runs[LOCAL])
    rdata = med(r.rate for r in runs[RAY_DATA])
    print(
        "| loader | samples/s | vs local | vs Ray Data | share of decode limit | first batch ms "
        "| trainer process CPU ms/sample | Ray workers | raylet | GCS | Ray other | loader processes "
        "| whole node ms/sample |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in order:
        rs = runs[name]
        rate = med(r.rate for r in rs)
        parts = [med(r.per_sample_ms(k) for r in rs) for k in KINDS]
        total = med(sum(r.per_sample_ms(k) for k in KINDS) for r in rs)
        print(
            f"| {name} | {rate:.0f} | {rate / local:.2f}x | {rate / rdata:.2f}x | {rate / (cores * rate1):.0%} "
            f"| {med(r.first for r in rs) * 1e3:.0f} | "
            + " | ".join(f"{p:.3f}" for p in parts)
            + f" | {total:.3f} |"
        )
    print(
        "\nsamples/s: all epochs' samples over the time from construction to the end of the last epoch "
        "(start-up included; the Ray cluster's own start is not: it was started once, before the rounds). "
        "CPU columns: user+sys per sample over the same span, from /proc (10 ms ticks): the trainer's "
        "process (all its threads), then the processes under it by kind. Decode limit: usable cores x the "
        "single-core decode rate measured at the start."
    )


def print_cluster(runs: list[Run], label: str = "the engine's chunk") -> None:
    cs = [r.cluster for r in runs if r.cluster is not None and r.cluster.samples]
    if not cs:
        return

    def per(f: Callable[[Any], float]) -> float:
        return med(f(c) / c.samples * 1e3 for c in cs)

    print(
        f"\ndecode_on='ray', {label}, loader.stats.cluster (median over rounds): {med(c.tasks for c in cs):.0f} tasks, "
        f"{med(c.samples / c.tasks for c in cs):.1f} samples per task, {cs[0].slots} at once, busy "
        f"{med(c.busy_share for c in cs):.0%}; per sample {per(lambda c: c.decode_seconds):.3f} ms decoding "
        f"in the task, {per(lambda c: c.transfer_seconds):.3f} ms of the round trip waiting and in transfer"
    )


def fit_trainer_cost(points: list[tuple[float, float]]) -> tuple[float, float]:
    """``c_t(k) = a + b / k`` by least squares over ``(k, c_t)``: (a ms per sample, b ms per task)."""
    if len({k for k, _ in points}) < 2:
        return points[0][1], 0.0
    x = np.array([1 / k for k, _ in points])
    y = np.array([c for _, c in points])
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def engine_chunk(batch_size: int, tasks: int) -> int:
    """The samples per task the engine picks for ``decode_on="ray"`` with ``tasks`` slots."""
    return engine_epoch.cluster_chunk(batch_size, tasks)


def print_scaling(
    c_t: float, fit: tuple[float, float], d: float, d_task: float, file_bytes: float, cores: int, batch: int
) -> None:
    a, b = fit
    nets = [g * 1e9 / 8 / max(file_bytes, DECODED_BYTES) for g in (10, 25, 100)]
    print(
        "\n### Scaling estimate on paper (from this run's costs)\n\n"
        f"- trainer-side CPU per sample on the Ray path c_t = {c_t:.3f} ms at the engine's chunk here "
        f"=> one trainer core (the loader's loop holds the GIL) takes <= {1e3 / c_t:,.0f} samples/s; over "
        f"the chunk sizes run, c_t(k) = {a:.3f} ms per sample + {b:.2f} ms per task / k samples per task "
        f"(k = 8: {a + b / 8:.3f} ms, 32: {a + b / 32:.3f} ms)\n"
        f"- bytes per sample through the trainer's NIC: {file_bytes / 1e3:.0f} KB out (the file, sent "
        f"as bytes), {DECODED_BYTES / 1e3:.1f} KB in (3x224x224 uint8); full duplex, so the larger "
        "direction binds: "
        + ", ".join(f"{g} Gbit/s => {n:,.0f} samples/s" for g, n in zip((10, 25, 100), nets, strict=True))
        + "\n"
        f"- cluster CPU per sample d = {d:.3f} ms of one core (Ray's processes on this node per sample: "
        f"workers, raylet, GCS; the decode alone in the task: {d_task:.3f} ms) => N nodes x C cores give "
        "N*C*1000/d samples/s\n"
    )
    print(
        f"| nodes x {cores} cores | cluster samples/s | engine's chunk | trainer core samples/s | 10 Gbit/s "
        "| 25 Gbit/s | 100 Gbit/s | samples/s at 25 Gbit/s | binds |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n in (1, 2, 4, 8, 16):
        cluster = n * cores * 1e3 / d
        k = engine_chunk(batch, n * cores)
        trainer = 1e3 / (a + b / k)
        limits = {"cluster CPU": cluster, "trainer CPU": trainer, "network (25 Gbit/s)": nets[1]}
        binds = min(limits, key=lambda name: limits[name])
        print(
            f"| {n} | {cluster:,.0f} | {k} | {trainer:,.0f} | {nets[0]:,.0f} | {nets[1]:,.0f} | {nets[2]:,.0f} "
            f"| {limits[binds]:,.0f} | {binds} |"
        )
    print(
        "\nsamples/s = min(cluster, trainer core, network); the trainer's own node is not counted in the "
        "cluster's cores. Trainer core: 1000 / c_t(k) at the chunk the engine picks for that many tasks. The "
        "cluster's d includes Ray's per-task cost on the worker and the raylet; the GCS is the head's alone, "
        "so d is a little high for many nodes."
    )


# --- main ---------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data-dir", type=Path, default=default_data_dir(), help="dataset cache folder (%(default)s)"
    )
    p.add_argument("--images", type=int, default=2000, help="JPEG files (%(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved measured rounds (%(default)s)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per measurement (%(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="(%(default)s)")
    p.add_argument("--cpus", type=int, default=usable_cpus(), help="the Ray cluster's CPUs (%(default)s)")
    p.add_argument("--torch", choices=["on", "off"], default="on", help="also DataLoader (%(default)s)")
    p.add_argument(
        "--chunks", default="8,64", help="extra Ray runs with K samples per task, comma-separated ('' none)"
    )
    p.add_argument("--nodes-cores", type=int, default=16, help="cores per node in the estimate (%(default)s)")
    p.add_argument(
        "--decode-seconds", type=float, default=3.0, help="single-core decode timing (%(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="(%(default)s)")
    args = p.parse_args()
    args.chunks = [int(k) for k in args.chunks.split(",") if k.strip()]
    if min(args.images, args.rounds, args.epochs, args.batch_size, args.cpus, args.nodes_cores) < 1:
        p.error("--images, --rounds, --epochs, --batch-size, --cpus and --nodes-cores must be positive")
    return args


ARGS = argparse.Namespace()


def main() -> int:
    args = parse_args()
    ARGS.__dict__.update(vars(args))
    cores = usable_cpus()
    folder = args.data_dir / f"{args.images}img_10cls_500x375"
    make_image_folder(folder, num_images=args.images, num_classes=10, size=(500, 375))
    files = FileDataset.from_folder(folder)
    for path in files.paths:  # page cache warm for every run alike
        read_file(path)
    file_bytes = sum(os.path.getsize(p) for p in files.paths) / len(files)
    data_line = f"{len(files)} JPEGs, 500x375, {file_bytes / 1e3:.0f} KB mean, in {folder}"
    print(f"# data: {data_line}", flush=True)

    load_start = loadavg()
    rate1 = decode_rate(files, random_crop, args.decode_seconds)
    print(
        f"# single-core decode {rate1:.0f} samples/s ({1e3 / rate1:.3f} ms), limit {cores} x {rate1:.0f} "
        f"= {cores * rate1:.0f} samples/s",
        flush=True,
    )

    # The workers of Ray's cluster import userfns (Ray Data's function) and this checkout's aioloader.
    here = Path(__file__).resolve().parent
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(here), str(here.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    import ray
    import ray.data

    t0 = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - t0
    print(f"# ray.init(num_cpus={args.cpus}): {ray_start:.1f} s", flush=True)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False

    def make_local(r: int) -> Callable[[], Loader]:
        return lambda: Loader(
            files, batch_size=args.batch_size, decode=random_crop, shuffle=True, seed=args.seed + r
        )

    def make_ray(r: int) -> Callable[[], Loader]:
        return lambda: Loader(
            files,
            batch_size=args.batch_size,
            decode=random_crop,
            shuffle=True,
            seed=args.seed + r,
            decode_on="ray",
        )

    def make_ray_data(r: int) -> Callable[[], Any]:
        return lambda: ray.data.read_binary_files(list(files.paths), shuffle="files").map_batches(
            crop_batch, batch_format="numpy", batch_size=args.batch_size
        )

    def make_torch(r: int) -> Callable[[], Any]:
        return lambda: DataLoader(
            PeerDataset(files, random_crop, read_file, True, args.seed + r),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.cpus,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(args.seed + r),
        )

    Maker = tuple[str, Callable[[int], Callable[[], Any]], Callable[[Any, int], Iterable[Any]], int | None]
    makers: list[Maker] = [
        (LOCAL, make_local, loader_epochs, None),
        (RAY, make_ray, loader_epochs, None),
        (RAY_DATA, make_ray_data, ray_data_epochs, None),
    ]
    if args.torch == "on":
        makers.append((TORCH, make_torch, torch_epochs, None))
    makers += [(f"{RAY}, chunk {k}", make_ray, loader_epochs, k) for k in args.chunks]
    runs: dict[str, list[Run]] = defaultdict(list)
    try:
        for r in range(args.rounds):
            for name, maker, epochs, chunk in makers:
                with chunk_of(chunk):
                    run = measure(maker(r), epochs, args.epochs)
                runs[name].append(run)
                print(
                    f"# round {r + 1}/{args.rounds} {name}: {run.samples} samples in {run.seconds:.2f} s "
                    f"({run.rate:.0f}/s), first batch {run.first * 1e3:.0f} ms, trainer CPU "
                    f"{run.per_sample_ms('trainer'):.3f} ms/sample, loadavg {loadavg()}",
                    flush=True,
                )
    finally:
        ray.shutdown()
    rate_end = decode_rate(files, random_crop, args.decode_seconds)
    load_end = loadavg()

    order = [name for name, _, _, _ in makers]
    print()
    print(f"Command: `{shlex.join([os.path.basename(sys.executable), *sys.argv])}`")
    print()
    print("\n".join(machine()))
    print(f"- Ray {ray.__version__}, ray[data] (pyarrow {importlib.metadata.version('pyarrow')})")
    print(
        f"- workload: {data_line}; decode userfns.random_crop (a plain function, nothing declared); batch "
        f"{args.batch_size}, shuffled; {args.epochs} epochs per run, start-up included; medians of "
        f"{args.rounds} interleaved rounds ({', '.join(order)})"
    )
    print(
        f"- Ray: one node, ray.init(num_cpus={args.cpus}) once before the rounds ({ray_start:.1f} s, not in any "
        f"run); Ray Data: read_binary_files(shuffle='files') -> map_batches(batch_size={args.batch_size}, "
        f"batch_format='numpy') -> iter_torch_batches(batch_size={args.batch_size}); DataLoader "
        f"num_workers={args.cpus}, persistent_workers=True"
    )
    print(
        f"- single-core decode {rate1:.0f} samples/s at the start, {rate_end:.0f} at the end; decode limit "
        f"{cores} usable cores x {rate1:.0f} = {cores * rate1:.0f} samples/s"
    )
    print(f"- 1-min load average at start {load_start}, at end {load_end}")
    print()
    print_table(runs, order, cores, rate1)
    print_cluster(runs[RAY])
    for k in args.chunks:
        print_cluster(runs[f"{RAY}, chunk {k}"], f"chunk {k}")

    ray_runs = runs[RAY]
    c_t = med(r.per_sample_ms("trainer") for r in ray_runs)
    d = med(sum(r.per_sample_ms(k) for k in ("ray workers", "raylet", "gcs", "ray other")) for r in ray_runs)
    d_task = med(
        r.cluster.decode_seconds / r.cluster.samples * 1e3 for r in ray_runs if r.cluster is not None
    )
    points = [
        (r.cluster.samples / r.cluster.tasks, r.per_sample_ms("trainer"))
        for name in order
        if name.startswith(RAY)
        for r in runs[name]
        if r.cluster is not None and r.cluster.tasks
    ]
    fit = fit_trainer_cost(points)
    print_scaling(c_t, fit, d, d_task, file_bytes, args.nodes_cores, args.batch_size)

    local = med(r.rate for r in runs[LOCAL])
    rate = med(r.rate for r in ray_runs)
    rdata = med(r.rate for r in runs[RAY_DATA])
    print("\n### Targets\n")
    print("| target | measured | met |")
    print("|---|---:|---|")
    print(f"| ray >= 0.8x local, one node | {rate / local:.2f}x | {'yes' if rate >= 0.8 * local else 'no'} |")
    print(f"| ray >= Ray Data | {rate / rdata:.2f}x | {'yes' if rate >= rdata else 'no'} |")
    print(
        f"| trainer CPU per sample on the Ray path <= 0.3 ms | {c_t:.3f} ms | {'yes' if c_t <= 0.3 else 'no'} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
