"""Soak run (issue 5): many epochs over real JPEGs with corrupt files and killed workers.

50 epochs over 2,000 files of which 1% are corrupt, ``on_error="skip"``, one decode worker
SIGKILLed in every 5th epoch. Checks, printed as PASS/FAIL in a markdown report (the exit
status is 1 when one fails):

- every good sample is delivered exactly once per epoch, no corrupt one ever, and each
  delivered image is the one of its label (the bytes of an in-process decode of that file);
- the skip count is exact: ``loader.stats`` failures rise by exactly the corrupt count per
  epoch, and the ``aioloader`` logger warns once per corrupt file over the loader's life;
- each kill is one counted worker restart, and the epoch it happened in loses nothing;
- memory is flat: the footprint after epoch 50 is within 10% of the one after epoch 5, and
  so is the max/min over epochs 5..50;
- after ``close()``: no ``aioloader-*`` thread, no child process, the fds of before the
  loader existed (so no memfd slab's descriptor either), and none of this process's
  ``aioloader-*`` slabs: memfd descriptors, or segments in ``/dev/shm`` (the fallback).

Memory footprint: the sum over this process and all its descendants (decode workers, fork
server, resource tracker) of ``Pss_Anon + Pss_File`` from ``/proc/<pid>/smaps_rollup``,
plus the allocated size of this process's ``aioloader-*`` slabs (memfd, or ``/dev/shm``
segments). PSS splits pages shared between processes (the forked workers share their
parent's libraries) instead of counting them once per process as RSS would; shared memory
is left out of PSS and counted once, by the slabs' size, so a slab mapped by three processes
is not counted three times.

Labels are the dataset indices (``FileDataset(paths, labels=range(n))``), so the label tensor
says which sample each row is; images are decoded by the real ``ImageDecoder(64)``, whose
fixed ``output_shape`` takes the zero-copy shared-memory slab path.

    python benchmarks/soak.py [--epochs 50] [--files 2000] [--corrupt 20] [--kill-every 5]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing import forkserver, resource_tracker
from pathlib import Path
from typing import Any

import numpy as np

from aioloader import FileDataset, ImageDecoder, Loader
from aioloader.decode.pool import mp_context
from aioloader.procs import zygote
from aioloader.synthetic import make_image_folder

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import process_tree as descendants
from helpers import shared_helper_pids as helper_pids
from throughput import loadavg, machine

SHM = "/dev/shm"
MiB = 2**20


# -- data -----------------------------------------------------------------------------------


def build_dataset(
    root: Path, files: int, corrupt: int, size: tuple[int, int]
) -> tuple[list[str], dict[int, str]]:
    """``files`` JPEGs in ``root/run`` (pristine ones generated once in ``root/clean``), of
    which ``corrupt`` spread over the index range are damaged, three ways in turn: cut to
    half their length, header overwritten, emptied. Returns the paths and ``{index: damage}``."""
    clean = make_image_folder(root / "clean", num_images=files, num_classes=10, size=size, seed=0)
    sources = sorted(clean.rglob("*.jpg"))
    assert len(sources) == files, f"{clean} holds {len(sources)} JPEGs, expected {files}"
    run = root / "run"
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    rng = np.random.default_rng(1234)
    bad = sorted(int(i) for i in rng.choice(files, size=corrupt, replace=False))
    kinds = ("truncated", "bad header", "empty")
    damage = {i: kinds[k % len(kinds)] for k, i in enumerate(bad)}
    paths = []
    for i, src in enumerate(sources):
        dst = run / f"{i:05d}.jpg"
        data = src.read_bytes()
        kind = damage.get(i)
        if kind == "truncated":
            data = data[: len(data) // 2]
        elif kind == "bad header":
            data = b"\x00garbage\x00" + data[10:]
        elif kind == "empty":
            data = b""
        dst.write_bytes(data)
        paths.append(str(dst))
    return paths, damage


def row_hash(row: np.ndarray[Any, Any]) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(row).tobytes(), digest_size=8).digest()


def expected_hashes(paths: list[str], damage: dict[int, str], decode: ImageDecoder) -> dict[int, bytes]:
    """The hash of each good file's in-process decode; also proves each damaged file fails."""
    out = {}
    for i, p in enumerate(paths):
        data = Path(p).read_bytes()
        if i in damage:
            try:
                if data:
                    decode(data)
            except Exception:  # noqa: BLE001 - any decode error is what we want here
                continue
            if data:
                raise SystemExit(f"file {p} ({damage[i]}) decodes in-process: it is not corrupt")
            continue
        out[i] = row_hash(decode(data))
    return out


# -- process, fd, thread and memory probes --------------------------------------------------


def fds() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass  # the fd listdir itself used
    return out


def loader_threads() -> set[str]:
    return {f"{t.name}#{t.ident}" for t in threading.enumerate() if t.name.startswith("aioloader")}


def my_segments() -> dict[str, int]:
    """This process's ``aioloader-<pid>-*`` slabs and their allocated sizes: the memfd slabs
    it holds a descriptor of, and its segments in ``/dev/shm`` (the fallback). Another
    process's loader, e.g. a colleague's test run, has its own pid in the name."""
    prefix = f"aioloader-{os.getpid()}-"
    out = {}
    for name in os.listdir(SHM):
        if name.startswith(prefix):
            try:
                out[name] = os.stat(os.path.join(SHM, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith(f"/memfd:{prefix}"):
                out[link.removeprefix("/memfd:").removesuffix(" (deleted)")] = (
                    os.stat(f"/proc/self/fd/{fd}").st_blocks * 512
                )
        except OSError:
            pass  # closed meanwhile
    return out


def pss(pid: int) -> tuple[int, int]:
    """``(Pss_Anon + Pss_File, Pss_Shmem)`` of ``pid`` in bytes (0, 0 if it is gone)."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                    fields[parts[0][:-1]] = int(parts[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0, 0
    return fields.get("Pss_Anon", 0) + fields.get("Pss_File", 0), fields.get("Pss_Shmem", 0)


@dataclass
class Memory:
    main: int
    others: int
    shm: int
    segments: int
    shm_mapped: int
    processes: int

    @property
    def total(self) -> int:
        return self.main + self.others + self.shm


def memory() -> Memory:
    main, main_shm = pss(os.getpid())
    others = mapped = 0
    kids = descendants()
    for pid in kids:
        a, s = pss(pid)
        others += a
        mapped += s
    segs = my_segments()
    return Memory(main, others, sum(segs.values()), len(segs), main_shm + mapped, len(kids))


# -- the soak ------------------------------------------------------------------------------


class CountWarnings(logging.Handler):
    """Counts the ``aioloader`` logger's records (the soak's own output stays clean)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.skipped: dict[str, int] = {}
        self.other: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("skipped "):
            err = record.args[0] if isinstance(record.args, tuple) and record.args else None
            path = getattr(err, "path", msg)
            self.skipped[path] = self.skipped.get(path, 0) + 1
        else:
            self.other.append(f"{record.levelname}: {msg}")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Results:
    checks: list[Check] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)
    kills: list[tuple[int, int]] = field(default_factory=list)  # (epoch, pid)
    samples: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    error: str | None = None

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))


def soak(
    args: argparse.Namespace, paths: list[str], damage: dict[int, str], expected: dict[int, bytes]
) -> Results:
    res = Results()
    n = len(paths)
    good = set(range(n)) - set(damage)
    dataset = FileDataset(paths, labels=range(n))
    decode = ImageDecoder(args.image_size)
    reasons = {
        "DecodeError": sum(k != "empty" for k in damage.values()),
        "ReadError": sum(k == "empty" for k in damage.values()),
    }
    reasons = {k: v for k, v in reasons.items() if v}

    counter = CountWarnings()
    log = logging.getLogger("aioloader")
    log.addHandler(counter)
    log.propagate = False  # counted, not printed: 20 files x "skipped ..." would drown the report

    # Start what lives for the whole process by design (as tests/conftest.py does) before the
    # "before" snapshot: the zygote, the fork server, the resource tracker and libuv's signal
    # pipe.
    zygote.context()
    if mp_context().get_start_method() == "forkserver":
        forkserver.ensure_running()
    resource_tracker.ensure_running()
    try:
        import uvloop

        uvloop.new_event_loop().close()
    except ImportError:
        pass
    gc.collect()
    before = (loader_threads(), descendants() - helper_pids(), fds(), set(my_segments()))

    bad_epochs: list[str] = []
    samples_ok = True
    failures_ok = True
    restarts_ok = True
    images_ok = True
    start = time.perf_counter()
    loader = Loader(
        dataset,
        batch_size=args.batch_size,
        decode=decode,
        shuffle=True,
        seed=0,
        on_error="skip",
        num_workers=args.workers,
        max_worker_restarts=args.max_worker_restarts,
        loader_process=False,  # it kills this process's workers and reads its slabs
    )
    try:
        with loader:
            for epoch in range(args.epochs):
                kill = args.kill_every > 0 and (epoch + 1) % args.kill_every == 0
                loader.set_epoch(epoch)
                before_stats = loader.stats
                t0 = time.perf_counter()
                seen: list[int] = []
                wrong_image = 0
                for k, (images, labels) in enumerate(loader):
                    idx = labels.tolist()
                    rows = images.numpy()
                    wrong_image += sum(row_hash(rows[j]) != expected.get(i) for j, i in enumerate(idx))
                    seen.extend(idx)
                    del images, labels, rows  # the slab goes back to the pool now
                    if kill and k + 1 == args.kill_after:
                        # In-process (loader_process=False): the runtime's parts are this process's.
                        pool = loader._runtime.parts.pool if loader._runtime is not None else None
                        assert pool is not None
                        pids = sorted(pool.pids())
                        victim = pids[(epoch // args.kill_every) % len(pids)]
                        os.kill(victim, signal.SIGKILL)
                        res.kills.append((epoch + 1, victim))
                res.epoch_seconds.append(time.perf_counter() - t0)
                res.samples += len(seen)
                stats = loader.stats
                gc.collect()
                res.memory.append(memory())

                problems = []
                dup = len(seen) - len(set(seen))
                missing = good - set(seen)
                corrupt_seen = set(seen) & set(damage)
                if dup or missing or corrupt_seen:
                    samples_ok = False
                    problems.append(
                        f"{dup} duplicated, {len(missing)} missing, {len(corrupt_seen)} corrupt delivered"
                    )
                if wrong_image:
                    images_ok = False
                    problems.append(f"{wrong_image} images not those of their label")
                new_failures = stats.failures - before_stats.failures
                by_reason = {
                    r: stats.failures_by_reason.get(r, 0) - before_stats.failures_by_reason.get(r, 0)
                    for r in stats.failures_by_reason
                }
                by_reason = {r: v for r, v in by_reason.items() if v}
                if new_failures != len(damage) or by_reason != reasons:
                    failures_ok = False
                    problems.append(
                        f"failures +{new_failures} {by_reason}, expected +{len(damage)} {reasons}"
                    )
                if stats.worker_restarts != len(res.kills):
                    restarts_ok = False
                    problems.append(f"worker_restarts {stats.worker_restarts}, expected {len(res.kills)}")
                if problems:
                    bad_epochs.append(f"epoch {epoch + 1}{' (kill)' if kill else ''}: " + "; ".join(problems))
            final = loader.stats
            slabs = loader._runtime.parts.slabs if loader._runtime is not None else None
            slab_note = (
                f"{slabs.created} slabs created, {slabs.live} live at the end" if slabs else "no slabs"
            )
    except Exception as exc:  # noqa: BLE001 - reported as a failed check, with the rest
        res.error = f"{type(exc).__name__}: {exc}"
        final = loader.stats
        slab_note = "?"
    finally:
        loader.close()
    res.seconds = time.perf_counter() - start

    # Let everything settle (a worker's exit, a finalizer) for up to 5 s, as the tests do.
    deadline = time.monotonic() + 5.0
    while True:
        gc.collect()
        threads = loader_threads() - before[0]
        procs = descendants() - helper_pids() - before[1]
        new_fds = fds() - before[2]
        segments = set(my_segments()) - before[3]
        if not (threads or procs or new_fds or segments) or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    epochs_done = len(res.epoch_seconds)
    res.check(
        "ran to the end",
        res.error is None and epochs_done == args.epochs,
        f"{epochs_done} of {args.epochs} epochs" + (f"; stopped by {res.error}" if res.error else ""),
    )
    res.check(
        "every good sample exactly once per epoch, no corrupt one",
        samples_ok and epochs_done == args.epochs,
        f"{len(good)} good samples x {epochs_done} epochs = {res.samples} delivered"
        f" (expected {len(good) * args.epochs})",
    )
    res.check(
        "each image is the decode of its label's file",
        images_ok,
        "per-row blake2b of every delivered image vs an in-process ImageDecoder of that file",
    )
    res.check(
        "skip count exact",
        failures_ok and final.failures == len(damage) * epochs_done,
        f"stats.failures {final.failures} = {len(damage)} x {epochs_done}; by reason {final.failures_by_reason}",
    )
    warned_once = len(counter.skipped) == len(damage) and all(v == 1 for v in counter.skipped.values())
    warned_files = set(counter.skipped) == {paths[i] for i in damage}
    res.check(
        "one WARNING per corrupt file over the loader's life",
        warned_once and warned_files,
        f"{sum(counter.skipped.values())} 'skipped' warnings for {len(counter.skipped)} files"
        + (f"; other log records: {counter.other}" if counter.other else ""),
    )
    res.check(
        "each SIGKILL is one worker restart, nothing lost in its epoch",
        restarts_ok and final.worker_restarts == len(res.kills),
        f"{len(res.kills)} kills (epochs {', '.join(str(e) for e, _ in res.kills)}), "
        f"stats.worker_restarts {final.worker_restarts}",
    )
    m = res.memory
    lo = args.flat_from - 1
    if len(m) > lo:
        window = [x.total for x in m[lo:]]
        main = [x.main for x in m[lo:]]
        first, last = m[lo].total, m[-1].total
        ratio = max(window) / min(window)
        res.check(
            f"memory flat within {args.flat_tolerance:.0%}, epoch {args.flat_from} to {len(m)}",
            abs(last / first - 1) <= args.flat_tolerance and ratio <= 1 + args.flat_tolerance,
            f"epoch {args.flat_from} {first / MiB:.1f} MiB, epoch {len(m)} {last / MiB:.1f} MiB "
            f"({last / first - 1:+.1%}); max/min over epochs {args.flat_from}..{len(m)} {ratio:.3f} "
            f"(main process alone {max(main) / min(main):.3f})",
        )
    else:
        res.check("memory flat", False, "too few epochs to compare")
    res.check("no aioloader thread after close", not threads, ", ".join(sorted(threads)) or "none")
    res.check("no child process after close", not procs, ", ".join(map(str, sorted(procs))) or "none")
    res.check(
        "fds back to the count before the loader",
        not new_fds,
        f"{len(before[2])} before, {len(fds())} after" + (f"; new: {sorted(new_fds)}" if new_fds else ""),
    )
    res.check(
        "no shared-memory slab left (memfd or /dev/shm)",
        not segments,
        (f"{len(segments)} left: {sorted(segments)[:3]}" if segments else "none") + f"; {slab_note}",
    )
    res.problems = bad_epochs
    log.removeHandler(counter)
    log.propagate = True
    return res


# -- report --------------------------------------------------------------------------------


def report(
    args: argparse.Namespace,
    res: Results,
    damage: dict[int, str],
    sizes: list[int],
    head: list[str],
    load: list[str],
) -> str:
    kinds: dict[str, int] = {}
    for k in damage.values():
        kinds[k] = kinds.get(k, 0) + 1
    lines = [
        f"Command: `{' '.join(['python', 'benchmarks/soak.py', *map(shlex.quote, sys.argv[1:])])}`",
        "",
        *head,
        f"- 1-min load average at the start: {load[0]}, at the end: {loadavg()}",
        f"- workload: {args.files} JPEGs {args.width}x{args.height} ({np.mean(sizes) / 1024:.1f} KB mean) -> "
        f"ImageDecoder({args.image_size}) uint8 [3,{args.image_size},{args.image_size}] (zero-copy slab path); "
        f"{len(damage)} corrupt ({', '.join(f'{v} {k}' for k, v in kinds.items())}); batch {args.batch_size}, "
        f"shuffle, seed 0, on_error='skip', {args.workers} worker processes",
        f"- faults: one decode worker SIGKILLed after batch {args.kill_after} of every {args.kill_every}th epoch; "
        f"max_worker_restarts={args.max_worker_restarts} (the default 3 counts restarts over the loader's "
        f"life, and this run kills {args.epochs // args.kill_every} workers by design)",
        f"- memory: sum over this process and its descendants (workers, fork server, resource tracker) of "
        f"Pss_Anon + Pss_File (/proc/PID/smaps_rollup), plus this process's aioloader-* slabs (memfd, or segments in {SHM})",
        f"- throughput: {res.samples} samples in {res.seconds:.1f} s = {res.samples / res.seconds:.0f} samples/s "
        f"overall (loader start to close, kills and checks included); epoch median "
        f"{np.median(res.epoch_seconds) if res.epoch_seconds else float('nan'):.2f} s",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    for c in res.checks:
        lines.append(f"| {c.name} | {'PASS' if c.ok else '**FAIL**'} | {c.detail} |")
    lines += [
        "",
        "| after epoch | main PSS MiB | workers + helpers PSS MiB | slabs MiB (count) | total MiB | vs epoch "
        f"{args.flat_from} | shm mapped, PSS MiB | processes | epoch s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    m = res.memory
    ref = m[args.flat_from - 1].total if len(m) >= args.flat_from else None
    kill_epochs = {e for e, _ in res.kills}
    for i, x in enumerate(m, 1):
        if i == 1 or i % 5 == 0 or i == len(m):
            vs = f"{x.total / ref - 1:+.1%}" if ref else "-"
            mark = " (kill)" if i in kill_epochs else ""
            lines.append(
                f"| {i}{mark} | {x.main / MiB:.1f} | {x.others / MiB:.1f} | {x.shm / MiB:.1f} ({x.segments}) | "
                f"{x.total / MiB:.1f} | {vs} | {x.shm_mapped / MiB:.1f} | {x.processes} | {res.epoch_seconds[i - 1]:.2f} |"
            )
    if res.problems:
        lines += ["", "Epochs with problems:", *(f"- {p}" for p in res.problems[:20])]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--corrupt", type=int, default=None, help="corrupt files (default 1%% of --files)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--kill-every", type=int, default=5, help="SIGKILL a worker in every Nth epoch (0: never)")
    p.add_argument("--kill-after", type=int, default=3, help="... after this many batches of that epoch")
    p.add_argument("--max-worker-restarts", type=int, default=20)
    p.add_argument("--width", type=int, default=96)
    p.add_argument("--height", type=int, default=72)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--flat-from", type=int, default=5, help="memory must be flat from this epoch on")
    p.add_argument("--flat-tolerance", type=float, default=0.10)
    p.add_argument("--data-dir", type=Path, default=None, help="keep the files here (default: a temp dir)")
    args = p.parse_args()
    if args.corrupt is None:
        args.corrupt = args.files // 100

    head = machine()
    load = [loadavg()]
    tmp = None
    root = args.data_dir
    if root is None:
        tmp = tempfile.mkdtemp(prefix="aioloader-soak-")
        root = Path(tmp)
    try:
        paths, damage = build_dataset(root, args.files, args.corrupt, (args.width, args.height))
        sizes = [os.path.getsize(q) for q in paths]
        expected = expected_hashes(paths, damage, ImageDecoder(args.image_size))
        res = soak(args, paths, damage, expected)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(report(args, res, damage, sizes, head, load))
    failed = [c.name for c in res.checks if not c.ok]
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
