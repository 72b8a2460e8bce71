"""GPU training benchmark: real training of torchvision ResNets fed by DataLoader and by
aioloader, side by side in the same run, against the GPU's and the CPUs' limits measured in
the same run. Skips cleanly (exit 0) without CUDA or without torchvision; asserts nothing
about time.

Workload: a generated ImageFolder of JPEGs (default 6,000 at 500x375, about 85-100 KB, in
1,000 classes; made once, in parallel, with ``aioloader.synthetic.make_image``, and reused),
torchvision ``resnet18`` and ``resnet50`` (``weights=None``), bf16 autocast,
``channels_last``, batch 256, SGD: forward, cross-entropy, backward, step. Every variant
normalises on the GPU inside the step (uint8 -> float, mean/std).

Variants (``--variants``), interleaved round-robin in ``--rounds`` rounds so that drift (clocks,
page cache, other tenants) hits all of them alike:

- ``dataloader``: ``torch.utils.data.DataLoader(num_workers=<usable CPUs>, pin_memory=True,
  shuffle=True, persistent_workers=True, drop_last=True)`` over a Dataset that reads the file
  and runs the user's own decode (``userfns.random_crop``: Pillow decode, RandomResizedCrop
  (224) and a random flip with Pillow and NumPy, uint8 CHW); ``.to("cuda", non_blocking=True)``
  in the loop;
- ``aioloader-cpu``: ``aioloader.Loader(FileDataset.from_folder(root), batch_size=256,
  decode=random_crop, shuffle=True, drop_last=True, device="cuda")``, defaults otherwise;
- ``aioloader-imagedecoder``: the same with ``decode=ImageDecoder(224, crop="random",
  hflip=True)`` (CPU decode);
- ``aioloader-gpu``: ``decode=ImageDecoder(224, crop="random", hflip=True, device="cuda")``,
  JPEG decode on the GPU (where this aioloader has no such decoder, the row says why).

Limits, same run: ``gpu-limit``, the same train step on one batch already on the GPU (no
loading); ``decode-limit``, the user's decode in a ``ProcessPoolExecutor`` of <usable CPUs>
processes over bytes already in memory (only decode, nothing else running), with the
single-core rate x cores beside it; the same for ``ImageDecoder`` on the CPU, for reference.

Each measurement constructs the loader and runs ``--epochs`` epochs: the clock starts before
construction, so epoch 1 carries the start-up; the steady rate is the samples of epochs 2..N
over their time (each epoch ends with ``torch.cuda.synchronize()``). Per variant, medians over
the rounds: img/s, ratio vs DataLoader, share of gpu-limit and of decode-limit, start-up (the
first batch, from before construction), the trainer process's CPU per batch in total and by
thread (``/proc/self/task/<tid>/stat`` utime+stime, grouped by thread name; threads that
exited meanwhile are the process total less the live threads), the whole process tree's CPU
per batch (``/proc`` walk: live descendants and those reaped), and for ``aioloader-gpu`` the
shares of samples decoded on the GPU and by CPU workers (``loader.stats.device_decode``).

GPU utilization (the ``GPU util`` column): NVML's ``utilization.gpu`` (the share of time a
kernel ran on the GPU, over NVML's own sample period of 1/6 to 1 s), sampled every 100 ms by
a thread (``gpu-util``) throughout each measurement and averaged over the steady epochs
(2..N), medians over the rounds; for ``gpu-limit``, over its timed steps. The first source
whose one reading works: NVML through ctypes (``libnvidia-ml.so.1``, the driver's), then
``torch.cuda.utilization`` (needs pynvml), then ``nvidia-smi --query-gpu=utilization.gpu
-lms 100`` (a process whose CPU is left out of the tree's); "n/a" where none works (the
header says why). Its thread's CPU is the trainer's (a few microseconds a reading).

    python benchmarks/gpu_train.py [--models resnet18,resnet50] [--images 6000] [--batch 256]
                                   [--epochs 3] [--rounds 2] [--root DIR] [--quick]
                                   [--variants dataloader,aioloader-cpu,aioloader-imagedecoder,aioloader-gpu]

``--quick``: 512 images, 2 epochs, 1 round, short limits (a smoke run of a couple of minutes).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VARIANTS = ("dataloader", "aioloader-cpu", "aioloader-imagedecoder", "aioloader-gpu")
DEFAULT_MODELS = ("resnet18", "resnet50")
#: The group of a thread with no Python name whose kernel name is the process's own (a
#: thread started by native code that never named itself: PyTorch's intra-op pool, OpenMP).
UNNAMED = "unnamed (intra-op pool)"
#: CPU of threads that ended during the measurement: the process total less the live threads.
EXITED = "(threads exited)"
#: ImageNet mean and std on the 0..255 scale.
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)

#: Where the models train and aioloader delivers (a constant so that the logic can be tried
#: on a machine without a GPU by setting it to "cpu"; the script itself skips without CUDA).
DEVICE = "cuda"

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# -- pure helpers ------------------------------------------------------------------------------


def stat_cpu_seconds(stat: str) -> float:
    """utime + stime in seconds from the text of a ``/proc/.../stat`` file (after the
    ``(comm)`` field, which may hold spaces and parentheses: fields 14 and 15)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def process_cpu(proc: str = "/proc/self") -> float:
    """This process's user + system CPU seconds, all its threads, living or ended
    (``/proc/self/stat``); NaN without ``/proc``."""
    try:
        with open(f"{proc}/stat") as f:
            return stat_cpu_seconds(f.read())
    except (OSError, IndexError, ValueError):
        return float("nan")


def thread_cpu(task_dir: str = "/proc/self/task") -> dict[int, tuple[str, float]]:
    """``{tid: (comm, cpu seconds)}`` for the live threads of this process: the kernel's
    name of each thread (``task/<tid>/comm``) and its utime + stime (``task/<tid>/stat``,
    clock-tick resolution). Empty without ``/proc``; a thread that ends while read is left
    out."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"{task_dir}/{tid}/stat") as f:
                out[int(tid)] = (comm, stat_cpu_seconds(f.read()))
        except (OSError, IndexError, ValueError):
            continue
    return out


def python_thread_names() -> dict[int, str]:
    """``{native thread id: Python name}`` of the live Python threads."""
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def thread_group(comm: str, python_name: str | None, process_comm: str) -> str:
    """The group a thread's CPU is reported under: its Python name if it has one, else its
    kernel name, with its number dropped (``pt_autograd_0`` -> ``pt_autograd``, ``Thread-3
    (_pin_memory_loop)`` -> ``Thread (_pin_memory_loop)``, ``aioloader-transfer`` stays); a nameless native thread whose kernel name is the
    process's own (``python``: PyTorch's intra-op pool, OpenMP workers) is :data:`UNNAMED`."""
    if not python_name and (comm == process_comm or comm.startswith("python")):
        return UNNAMED
    name = re.sub(r"^Thread-\d+", "Thread", python_name or comm)
    return name.rstrip("0123456789").rstrip("_- ") or name


def thread_cpu_delta(
    before: Mapping[int, tuple[str, float]],
    after: Mapping[int, tuple[str, float]],
    names: Mapping[int, str],
    process_comm: str,
    process_delta: float | None = None,
) -> dict[str, float]:
    """CPU seconds by thread group (:func:`thread_group`) between two :func:`thread_cpu`
    snapshots, per thread id (a thread born in between counts from 0). ``names``: Python
    names by thread id. With ``process_delta`` (the whole process's CPU over the same span),
    what the live threads do not account for (threads that ended) is :data:`EXITED`."""
    out: dict[str, float] = {}
    for tid, (comm, cpu) in after.items():
        spent = cpu - before.get(tid, (comm, 0.0))[1]
        if spent > 0:
            group = thread_group(comm, names.get(tid), process_comm)
            out[group] = out.get(group, 0.0) + spent
    if process_delta is not None and not math.isnan(process_delta):
        rest = process_delta - sum(out.values())
        if rest > 2.5 / _TICK:  # beyond the noise of readings made a moment apart, in ticks
            out[EXITED] = rest
    return out


def steady_rate(epochs: Sequence[tuple[int, float]], skip: int = 1) -> float:
    """Samples per second over the epochs after the first ``skip`` (``(samples, seconds)``
    each; the first carries the start-up). With no more than ``skip`` epochs, the last one.
    NaN with none, or no time."""
    if not epochs:
        return float("nan")
    steady = list(epochs[skip:]) or [epochs[-1]]
    samples = sum(s for s, _ in steady)
    seconds = sum(t for _, t in steady)
    return samples / seconds if seconds > 0 else float("nan")


def ratio(a: float | None, b: float | None) -> float:
    """``a / b``, NaN where either is missing, NaN or ``b`` is 0."""
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return float("nan")
    return a / b


def median(values: Iterable[float]) -> float:
    """The median of the values that are not NaN; NaN if none."""
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else float("nan")


def fmt(value: float | None, spec: str = ".0f", suffix: str = "") -> str:
    """``value`` formatted, or "-" where it is missing or NaN."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:{spec}}{suffix}"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table: the first column left-aligned, the others right-aligned; ``|`` in
    a cell is escaped."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    rows = list(rows)
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {row!r} has {len(row)} cells, the table {len(headers)} columns")
    out = [line(headers), "| " + " | ".join(["---"] + ["---:"] * (len(headers) - 1)) + " |"]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def threads_cell(by_thread: Mapping[str, float], batches: int, top: int = 6) -> str:
    """``name ms, ...``: CPU milliseconds per batch by thread group, largest first, the
    first ``top`` and the rest summed as ``other``; groups under 0.05 ms left out."""
    if batches <= 0:
        return "-"
    per = sorted(((v * 1e3 / batches, k) for k, v in by_thread.items()), reverse=True)
    per = [(ms, name) for ms, name in per if ms >= 0.05]
    shown = [f"{name} {ms:.1f}" for ms, name in per[:top]]
    rest = sum(ms for ms, _ in per[top:])
    if rest >= 0.05:
        shown.append(f"other {rest:.1f}")
    return ", ".join(shown) or "-"


def device_decode_counts(stats: Any) -> dict[str, float] | None:
    """``loader.stats.device_decode`` as ``{"gpu", "cpu", "fallbacks", "gpu_seconds"}``
    (read defensively: the attribute and its fields may be missing); None without it."""
    dd = getattr(stats, "device_decode", None)
    if dd is None:
        return None
    out = {}
    for key in ("gpu", "cpu", "fallbacks", "gpu_seconds"):
        value = getattr(dd, key, None)
        out[key] = float(value) if isinstance(value, (int, float)) else float("nan")
    return out


def decode_share_cell(counts: Mapping[str, float] | None) -> str:
    """``GPU x% / CPU y%`` of the samples decoded (with fallbacks and GPU decode ms per
    sample), or "-"."""
    if not counts:
        return "-"
    gpu, cpu = counts.get("gpu", float("nan")), counts.get("cpu", float("nan"))
    total = gpu + cpu
    if math.isnan(total) or total <= 0:
        return "-"
    text = f"GPU {gpu / total:.0%} / CPU {cpu / total:.0%}"
    fallbacks = counts.get("fallbacks", float("nan"))
    if not math.isnan(fallbacks):
        text += f", {fallbacks:.0f} fallbacks"
    gpu_s = counts.get("gpu_seconds", float("nan"))
    if not math.isnan(gpu_s) and gpu > 0:
        text += f", {gpu_s / gpu * 1e3:.2f} ms GPU/sample"
    return text


def parse_names(value: str, allowed: Sequence[str] | None, what: str) -> list[str]:
    """A comma-separated list, in order, without repeats; ValueError for a name not in
    ``allowed`` (any name when None) or an empty list."""
    names: list[str] = []
    for name in (n.strip() for n in value.split(",")):
        if not name:
            continue
        if allowed is not None and name not in allowed:
            raise ValueError(f"{what} {name!r}: choose from {', '.join(allowed)}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError(f"{what}: none given")
    return names


def parse_utilization(line: str) -> float | None:
    """A GPU utilization in percent from a line of ``nvidia-smi --query-gpu=utilization.gpu
    --format=csv,noheader,nounits`` (``"87"``; ``"87 %"`` with units); None for what is no
    number (``[N/A]``, ``[Not Supported]``, an error message, a blank line) or out of 0..100."""
    text = line.strip().removesuffix("%").strip()
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.0 <= value <= 100.0 else None


def mean_since(samples: Sequence[tuple[float, float]], since: float) -> float:
    """The mean of the ``(time, value)`` samples taken at ``since`` or later; all of them
    where none was (a span shorter than the sampling interval); NaN without any."""
    if not samples:
        return float("nan")
    kept = [v for t, v in samples if t >= since] or [v for _, v in samples]
    return sum(kept) / len(kept)


def util_cell(values: Iterable[float]) -> str:
    """The median GPU utilization over the rounds (``87%``), "n/a" where none was sampled."""
    value = median(values)
    return "n/a" if math.isnan(value) else f"{value:.0f}%"


def smi_id(props: Any, index: int) -> str:
    """How ``nvidia-smi -i`` names the device of ``props`` (``torch.cuda.get_device_properties``):
    its UUID (``GPU-...``), which does not depend on ``CUDA_VISIBLE_DEVICES`` as PyTorch's
    index does; the index where the properties have no UUID."""
    uuid = str(getattr(props, "uuid", "") or "")
    if not uuid:
        return str(index)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


class GpuUtil:
    """GPU utilization (percent of the time a kernel ran, NVML's ``utilization.gpu``) sampled
    on a thread of its own, ``gpu-util``, while a measurement runs: from ``command`` (a
    process printing one reading a line: ``nvidia-smi ... -lms 100``), or else by calling
    ``query`` every ``interval`` seconds (``torch.cuda.utilization``, which needs pynvml).
    ``samples``: ``(time.perf_counter(), percent)``; readings that are no number are left out.
    The process's CPU (:meth:`child_cpu`) is the sampler's, not the loader's: :func:`measure`
    leaves it out of the tree's CPU."""

    def __init__(
        self,
        command: Sequence[str] | None = None,
        query: Callable[[], float] | None = None,
        interval: float = 0.1,
    ) -> None:
        if (command is None) == (query is None):
            raise ValueError("GpuUtil: a command or a query, one of them")
        self.command = list(command) if command is not None else None
        self.query = query
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> GpuUtil:
        if self.command is not None:
            self._proc = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
            )
        self._thread = threading.Thread(target=self._run, name="gpu-util", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        if self._proc is not None:
            assert self._proc.stdout is not None
            for line in self._proc.stdout:
                value = parse_utilization(line)
                if value is not None:
                    self.samples.append((time.perf_counter(), value))
            return
        assert self.query is not None
        while not self._stop.is_set():
            try:
                value = parse_utilization(str(self.query()))
            except Exception:  # noqa: BLE001 - a failed reading is a missing sample
                value = None
            if value is not None:
                self.samples.append((time.perf_counter(), value))
            self._stop.wait(self.interval)

    def child_cpu(self) -> float:
        """The sampling process's CPU seconds so far (0 without one, or once it is gone)."""
        if self._proc is None:
            return 0.0
        cpu = process_cpu(f"/proc/{self._proc.pid}")
        return 0.0 if math.isnan(cpu) else cpu

    def stop(self) -> list[tuple[float, float]]:
        """Stop sampling (the process ended, the thread joined); the samples."""
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        if self._thread is not None:
            self._thread.join(5)
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
        return self.samples


def nvml_query(device: str, library: str = "libnvidia-ml.so.1") -> Callable[[], float]:
    """A call giving the utilization of ``device`` (a UUID ``GPU-...``, or NVML's index) from
    NVML through ctypes: the library the driver installs and ``nvidia-smi`` reads, without
    pynvml. OSError where the library, its start or the device is missing."""
    import ctypes

    lib = ctypes.CDLL(library)
    if lib.nvmlInit_v2() != 0:
        raise OSError("nvmlInit_v2 failed")
    handle = ctypes.c_void_p()
    if device.isdigit():
        rc = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(device)), ctypes.byref(handle))
    else:
        rc = lib.nvmlDeviceGetHandleByUUID(device.encode(), ctypes.byref(handle))
    if rc != 0:
        raise OSError(f"NVML: no device {device} (error {rc})")

    class Utilization(ctypes.Structure):
        _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

    def query() -> float:
        found = Utilization()
        rc = lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(found))
        if rc != 0:
            raise OSError(f"nvmlDeviceGetUtilizationRates: error {rc}")
        return float(found.gpu)

    return query


def gpu_util_sampler(
    torch: Any, index: int, interval_ms: int = 100
) -> tuple[Callable[[], GpuUtil] | None, str]:
    """``(a maker of GpuUtil, how it samples)`` for CUDA device ``index``, the first source
    whose one reading works: NVML through ctypes (:func:`nvml_query`),
    ``torch.cuda.utilization`` (pynvml), ``nvidia-smi``'s loop mode; ``(None, why)`` where
    none does."""
    why = []
    try:
        device = smi_id(torch.cuda.get_device_properties(index), index)
    except Exception:  # noqa: BLE001 - NVML's index then
        device = str(index)
    interval = interval_ms / 1e3
    queries: list[tuple[str, Callable[[], Callable[[], float]]]] = [
        (f"NVML (ctypes), {device}", lambda: nvml_query(device)),
        ("torch.cuda.utilization", lambda: lambda: float(torch.cuda.utilization(index))),
    ]
    for name, make in queries:
        try:
            query = make()
            if parse_utilization(str(query())) is not None:
                return (
                    lambda q=query: GpuUtil(query=q, interval=interval)
                ), f"{name}, every {interval_ms} ms"
            why.append(f"{name}: no reading")
        except Exception as e:  # noqa: BLE001 - missing library, NVML refusing: said in the report
            why.append(f"{name}: {type(e).__name__}: {e}".splitlines()[0][:120])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "; ".join([*why, "no nvidia-smi"])
    query_smi = [smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", device]
    try:
        out = subprocess.run(query_smi, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as e:
        out = f"{type(e).__name__}: {e}"
    if len([v for v in map(parse_utilization, out.splitlines()) if v is not None]) == 1:
        line_buffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []  # a line as it comes
        command = [*line_buffered, *query_smi, "-lms", str(interval_ms)]
        return (lambda: GpuUtil(command=command)), f"nvidia-smi -i {device} -lms {interval_ms}"
    return None, "; ".join([*why, f"nvidia-smi -i {device}: {out.strip()[:80] or 'no reading'}"])


# -- measurements ------------------------------------------------------------------------------


@dataclass
class Result:
    """One measurement of one variant: construct, ``epochs`` epochs, close."""

    epochs: list[tuple[int, float]]  # (samples, seconds); the first from before construction
    first_batch: float  # seconds from before construction to the first batch
    batches: int
    trainer_cpu: float  # this process's CPU seconds, all epochs
    tree_cpu: float  # the process tree's CPU seconds, all epochs
    threads: dict[str, float]  # trainer CPU seconds by thread group
    device_decode: dict[str, float] | None = None
    gpu_util: float = float("nan")  # mean GPU utilization (%) over epochs 2..N; NaN: not sampled

    @property
    def rate(self) -> float:
        return steady_rate(self.epochs)


@dataclass
class Row:
    """A variant's results over the rounds, or why it did not run."""

    name: str
    results: list[Result] = field(default_factory=list)
    unavailable: str | None = None


def make_folder(root: Path, images: int, classes: int, seed: int, workers: int) -> Path:
    """``images`` JPEGs of 500x375 in ``root/class_NNNN/`` (image ``i`` in class ``i %
    classes``, drawn by ``aioloader.synthetic.make_image`` from the generator ``(seed, i)``),
    written by ``workers`` processes; made once (``.complete``), then reused."""
    from concurrent.futures import ProcessPoolExecutor

    marker = root / ".complete"
    stamp = folder_stamp(images, classes, seed)
    if marker.is_file() and marker.read_text() == stamp:
        return root
    for c in range(min(classes, images)):
        (root / f"class_{c:04d}").mkdir(parents=True, exist_ok=True)
    chunks = [(str(root), range(i, min(i + 100, images)), classes, seed) for i in range(0, images, 100)]
    ctx = _fork_context()
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        for _ in pool.map(_write_images, chunks):
            pass
    marker.write_text(stamp)
    return root


def folder_stamp(images: int, classes: int, seed: int) -> str:
    """What :func:`make_folder` writes in ``.complete`` once a folder is whole."""
    return f"gpu_train {images} {classes} 500x375 q90 seed{seed}"


def _write_images(job: tuple[str, range, int, int]) -> None:
    import numpy as np

    from aioloader.synthetic import make_image

    root, indices, classes, seed = job
    for i in indices:
        img = make_image(np.random.default_rng([seed, i]), 500, 375)
        img.save(Path(root) / f"class_{i % classes:04d}" / f"img_{i:06d}.jpg", quality=90)


def _fork_context() -> Any:
    import multiprocessing

    return multiprocessing.get_context("fork")


#: The bytes the decode-limit pool decodes, set before the pool forks (inherited).
_DATA: list[bytes] = []
#: The decodes of the decode-limit runs, by name, set before the pool forks.
_DECODES: dict[str, Callable[[bytes], Any]] = {}


def _decode_chunk(job: tuple[str, int, int]) -> int:
    name, start, count = job
    decode = _DECODES[name]
    for i in range(start, start + count):
        decode(_DATA[i % len(_DATA)])
    return count


def decode_limits(
    data: list[bytes], decodes: dict[str, Callable[[bytes], Any]], cores: int, seconds: float
) -> dict[str, tuple[float, float]]:
    """``{name: (all-cores rate, single-core rate)}`` in samples/s for each decode: first on
    one core in this process, then in a pool of ``cores`` forked processes decoding chunks of
    the in-memory ``data``, nothing else running, for about ``seconds`` each (after a
    warm-up task per process)."""
    from concurrent.futures import ProcessPoolExecutor

    _DATA[:] = data
    _DECODES.clear()
    _DECODES.update(decodes)
    out = {}
    try:
        for name, decode in decodes.items():
            for d in data[:5]:
                decode(d)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                decode(data[n % len(data)])
                n += 1
            single = n / (time.perf_counter() - t0)
            chunk = 8
            with ProcessPoolExecutor(max_workers=cores, mp_context=_fork_context()) as pool:
                list(pool.map(_decode_chunk, [(name, i * chunk, chunk) for i in range(cores)]))  # warm
                done, start, t0 = 0, 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    jobs = [(name, start + i * chunk, chunk) for i in range(4 * cores)]
                    done += sum(pool.map(_decode_chunk, jobs))
                    start += 4 * cores * chunk
                out[name] = (done / (time.perf_counter() - t0), single)
    finally:
        _DATA.clear()
        _DECODES.clear()
    return out


def machine_lines(torch: Any, torchvision: Any, cores: int) -> list[str]:
    """The report's header: date, machine, software, command."""
    import platform

    import aioloader

    cpu, mem_gb = "unknown CPU", float("nan")
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
        with open("/proc/meminfo") as f:
            mem_gb = next(int(ln.split()[1]) for ln in f if ln.startswith("MemTotal")) / 2**20
    except (OSError, StopIteration, ValueError):
        pass
    try:
        from userfns import git_describe

        commit = git_describe(Path(__file__).resolve().parent)
    except ImportError:
        commit = "unknown"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    props = torch.cuda.get_device_properties(0)
    return [
        f"- date: {date}",
        f"- command: `python {shlex.join(sys.argv)}`",
        f"- GPU: {torch.cuda.get_device_name(0)} ({props.total_memory / 2**30:.0f} GiB), "
        f"CUDA {torch.version.cuda}",
        f"- machine: {os.cpu_count()} CPUs ({cores} usable), {cpu}, {mem_gb:.0f} GiB RAM, "
        f"{platform.system()} {platform.release()}",
        f"- software: Python {platform.python_version()}, torch {torch.__version__}, "
        f"torchvision {torchvision.__version__}, aioloader {aioloader.__version__} (git {commit})",
    ]


class Trainer:
    """One model, its SGD optimiser and the train step (normalise on the GPU, bf16 autocast,
    channels_last, forward, cross-entropy, backward, step)."""

    def __init__(self, torch: Any, torchvision: Any, name: str, device: Any) -> None:
        self.torch = torch
        self.device = device
        build = getattr(torchvision.models, name)
        self.model = build(weights=None, num_classes=1000).to(device).to(memory_format=torch.channels_last)
        self.model.train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1)

    def step(self, images: Any, labels: Any) -> None:
        torch = self.torch
        x = images.contiguous(memory_format=torch.channels_last).float().sub_(self.mean).div_(self.std)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(self.model(x), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def gpu_limit(self, batch: int, steps: int, warmup: int) -> float:
        """img/s of the step on one batch already on the device."""
        torch = self.torch
        images = torch.randint(0, 256, (batch, 3, 224, 224), dtype=torch.uint8, device=self.device)
        labels = torch.randint(0, 1000, (batch,), device=self.device)
        for _ in range(warmup):
            self.step(images, labels)
        sync(torch)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step(images, labels)
        sync(torch)
        return batch * steps / (time.perf_counter() - t0)


def measure(
    make: Callable[[], Any],
    trainer: Trainer,
    epochs: int,
    to_device: bool,
    util: Callable[[], GpuUtil] | None = None,
) -> Result:
    """Construct a loader with ``make`` (the clock and the CPU counters start before) and
    train ``epochs`` epochs on it; closed on return. With ``util``, the GPU's utilization is
    sampled throughout, its mean over the steady epochs (2..N) kept; the sampling process's
    CPU is left out of the tree's."""
    import gc

    from userfns import tree_cpu

    torch = trainer.torch
    gc.collect()
    sync(torch)
    process_comm = _process_comm()
    sampler = util().start() if util is not None else None
    names = python_thread_names()
    threads0, proc0 = thread_cpu(), process_cpu()
    tree0 = tree_cpu() - (sampler.child_cpu() if sampler is not None else 0.0)
    t0 = time.perf_counter()
    steady_from = t0
    try:
        loader = make()
    except BaseException:
        if sampler is not None:
            sampler.stop()
        raise
    dev = trainer.device
    try:
        eps: list[tuple[int, float]] = []
        first, batches = float("nan"), 0
        for e in range(epochs):
            start = t0 if e == 0 else time.perf_counter()
            if e == 1:
                steady_from = start
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(e)
            samples = 0
            for images, labels in loader:
                if math.isnan(first):
                    first = time.perf_counter() - t0
                if to_device:
                    images = images.to(dev, non_blocking=True)
                    labels = labels.to(dev, non_blocking=True)
                trainer.step(images, labels)
                samples += len(labels)
                batches += 1
            sync(torch)
            eps.append((samples, time.perf_counter() - start))
        names.update(python_thread_names())
        threads1, proc1 = thread_cpu(), process_cpu()
        tree1 = tree_cpu() - (sampler.child_cpu() if sampler is not None else 0.0)
        counts = device_decode_counts(getattr(loader, "stats", None))
    finally:
        samples = sampler.stop() if sampler is not None else []
        close = getattr(loader, "close", None)
        if close is not None:
            close()
        del loader  # DataLoader: its persistent workers stop with its iterator
        gc.collect()
    by_thread = thread_cpu_delta(threads0, threads1, names, process_comm, proc1 - proc0)
    util_mean = mean_since(samples, steady_from)
    return Result(eps, first, batches, proc1 - proc0, tree1 - tree0, by_thread, counts, util_mean)


def sync(torch: Any) -> None:
    """Wait for the GPU's queued work (nothing to wait for on the CPU)."""
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def _process_comm() -> str:
    try:
        with open("/proc/self/comm") as f:
            return f.read().strip()
    except OSError:
        return "python"


# -- the run -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="torchvision models (%(default)s)")
    p.add_argument("--images", type=int, default=None, help="JPEGs to generate (6000; --quick 512)")
    p.add_argument("--classes", type=int, default=1000, help="class folders, at most 1000 (%(default)s)")
    p.add_argument("--batch", type=int, default=256, help="(%(default)s)")
    p.add_argument(
        "--epochs", type=int, default=None, help="epochs per measurement, start-up included (3; --quick 2)"
    )
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (2; --quick 1)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="(%(default)s)")
    p.add_argument(
        "--root",
        type=Path,
        default=None,
        help="the JPEG folder: generated there unless it holds an ImageFolder already "
        "(default: $AIOLOADER_CACHE/bench/gpu_<images>img_<classes>cls_500x375)",
    )
    p.add_argument("--gpu-steps", type=int, default=None, help="timed steps of gpu-limit (30; --quick 5)")
    p.add_argument(
        "--decode-seconds", type=float, default=None, help="seconds per decode-limit timing (3; --quick 1)"
    )
    p.add_argument("--seed", type=int, default=0, help="(%(default)s)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 512 images, 2 epochs, 1 round")
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {
        "images": (6000, 512),
        "epochs": (3, 2),
        "rounds": (2, 1),
        "gpu_steps": (30, 5),
        "decode_seconds": (3.0, 1.0),
    }
    for key, (normal, small) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, small if quick else normal)
    try:
        args.models = parse_names(args.models, None, "--models")
        args.variants = parse_names(args.variants, VARIANTS, "--variants")
    except ValueError as e:
        p.error(str(e))
    if min(args.images, args.batch, args.epochs, args.rounds, args.gpu_steps, args.classes) < 1:
        p.error("--images, --classes, --batch, --epochs, --rounds and --gpu-steps must be positive")
    if args.classes > 1000:
        p.error("--classes: at most 1000 (the models' head)")
    if args.images < args.batch:
        p.error("--images must be at least --batch (drop_last=True)")
    return args


def default_root(images: int, classes: int) -> Path:
    env = os.environ.get("AIOLOADER_CACHE")
    cache = Path(env).expanduser() if env else Path.home() / ".cache" / "aioloader"
    return cache / "bench" / f"gpu_{images}img_{classes}cls_500x375"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_train: skipped: torch not installed")
        return 0
    if not torch.cuda.is_available():
        print("gpu_train: skipped: no CUDA device")
        return 0
    try:
        import torchvision
    except ImportError:
        print("gpu_train: skipped: torchvision not installed")
        return 0
    for name in args.models:
        if not callable(getattr(torchvision.models, name, None)):
            print(f"gpu_train: --models {name!r} is not a torchvision model", file=sys.stderr)
            return 2
    return run(args, torch, torchvision)


def run(args: argparse.Namespace, torch: Any, torchvision: Any) -> int:
    from torch.utils.data import DataLoader
    from userfns import PeerDataset, random_crop, read_file

    from aioloader import FileDataset, ImageDecoder, Loader
    from aioloader.config import usable_cpus

    cores = usable_cpus()
    print(f"# gpu_train: {', '.join(args.models)}, {cores} usable CPUs", flush=True)

    # Data, then the decode limits, before a CUDA context is made and before any loader: the
    # pools fork a process with nothing else running.
    t0 = time.perf_counter()
    root = args.root or default_root(args.images, args.classes)
    marker = root / ".complete"
    ours = marker.is_file() and marker.read_text() == folder_stamp(args.images, args.classes, args.seed)
    if args.root is not None and not ours and any(root.glob("*/*.jp*g")):
        source = f"the ImageFolder in {root}"  # someone else's: used as it is
    else:
        make_folder(root, args.images, args.classes, args.seed, cores)
        source = f"generated in {root}"
    files = FileDataset.from_folder(root)
    if len(files.classes or ()) > 1000:
        print(f"gpu_train: {root} has {len(files.classes or ())} classes, the models 1000", file=sys.stderr)
        return 2
    data = [read_file(p) for p in files.paths]  # also warms the page cache for every run alike
    mean_kb = sum(len(d) for d in data) / len(data) / 1e3
    data_line = f"{len(files)} JPEGs, {mean_kb:.0f} KB mean, {source}"
    print(f"# data: {data_line} (ready in {time.perf_counter() - t0:.1f} s)", flush=True)
    decodes: dict[str, Callable[[bytes], Any]] = {"user fn": random_crop}
    if {"aioloader-imagedecoder", "aioloader-gpu"} & set(args.variants):
        decodes["ImageDecoder (CPU)"] = ImageDecoder(224, crop="random", hflip=True)
    limits = decode_limits(data[:2000], decodes, cores, args.decode_seconds)
    del data
    for name, (rate, single) in limits.items():
        print(
            f"# decode-limit, {name}: {rate:.0f} img/s in {cores} processes "
            f"(single core {single:.0f} x {cores} = {single * cores:.0f})",
            flush=True,
        )
    decode_limit = limits["user fn"][0]

    dev = torch.device(DEVICE)
    torch.backends.cudnn.benchmark = True
    header = machine_lines(torch, torchvision, cores)
    util: Callable[[], GpuUtil] | None = None
    util_how = f"not sampled: the device is {DEVICE}"
    if DEVICE.startswith("cuda"):
        util, util_how = gpu_util_sampler(
            torch, dev.index if dev.index is not None else torch.cuda.current_device()
        )
    print(f"# GPU utilization: {util_how if util is not None else 'n/a: ' + util_how}", flush=True)

    gpu_decoder: Any = None
    gpu_unavailable: str | None = None
    if "aioloader-gpu" in args.variants:
        on_device: dict[str, Any] = {"device": DEVICE}  # a keyword this aioloader may not have yet
        try:
            gpu_decoder = ImageDecoder(224, crop="random", hflip=True, **on_device)
        except (TypeError, ValueError, ImportError) as e:
            gpu_unavailable = f"gpu decode unavailable: {type(e).__name__}: {e}"
            print(f"# {gpu_unavailable}", flush=True)

    def make(variant: str, r: int) -> Callable[[], Any]:
        if variant == "dataloader":
            return lambda: DataLoader(
                PeerDataset(files, random_crop, read_file, True, args.seed + r),
                batch_size=args.batch,
                num_workers=cores,
                pin_memory=True,
                shuffle=True,
                persistent_workers=True,
                drop_last=True,
                generator=torch.Generator().manual_seed(args.seed + r),
            )
        decode = {
            "aioloader-cpu": random_crop,
            "aioloader-imagedecoder": ImageDecoder(224, crop="random", hflip=True),
            "aioloader-gpu": gpu_decoder,
        }[variant]
        return lambda: Loader(
            FileDataset.from_folder(root),
            batch_size=args.batch,
            decode=decode,
            shuffle=True,
            drop_last=True,
            device=DEVICE,
        )

    sections = []
    for model_name in args.models:
        trainer = Trainer(torch, torchvision, model_name, dev)
        gpu_limits: list[float] = []
        gpu_utils: list[float] = []
        rows = {v: Row(v) for v in args.variants}
        if gpu_unavailable and "aioloader-gpu" in rows:
            rows["aioloader-gpu"].unavailable = gpu_unavailable
        trainer.gpu_limit(args.batch, steps=3, warmup=10)  # cudnn's autotuning, once
        for r in range(args.rounds):
            sampler = util().start() if util is not None else None
            t_limit = time.perf_counter()
            try:
                gpu_limits.append(trainer.gpu_limit(args.batch, args.gpu_steps, warmup=3))
            finally:
                gpu_utils.append(mean_since(sampler.stop(), t_limit) if sampler is not None else float("nan"))
            print(
                f"# {model_name} round {r + 1}: gpu-limit {gpu_limits[-1]:.0f} img/s, "
                f"GPU utilization {util_cell(gpu_utils[-1:])}",
                flush=True,
            )
            for variant, row in rows.items():
                if row.unavailable:
                    continue
                try:
                    res = measure(
                        make(variant, r), trainer, args.epochs, to_device=variant == "dataloader", util=util
                    )
                except (TypeError, ValueError, ImportError) as e:
                    if variant != "aioloader-gpu":
                        raise
                    row.unavailable = f"gpu decode unavailable: {type(e).__name__}: {e}"
                    print(f"# {model_name} round {r + 1}: {row.unavailable}", flush=True)
                    continue
                except Exception as e:  # the GPU decoder is new: report it, measure the rest
                    if variant != "aioloader-gpu":
                        raise
                    traceback.print_exc()
                    row.unavailable = f"gpu decode failed: {type(e).__name__}: {e}"
                    continue
                row.results.append(res)
                print(
                    f"# {model_name} round {r + 1}: {variant}: {res.rate:.0f} img/s steady, first batch "
                    f"{res.first_batch:.2f} s, epochs "
                    + ", ".join(f"{s / t:.0f}" for s, t in res.epochs)
                    + f" img/s, trainer CPU {res.trainer_cpu / max(res.batches, 1) * 1e3:.0f} ms/batch, "
                    f"GPU utilization {util_cell([res.gpu_util])}",
                    flush=True,
                )
        sections.append(
            section(model_name, rows, median(gpu_limits), gpu_limits, decode_limit, limits, cores, gpu_utils)
        )
        del trainer
        torch.cuda.empty_cache()

    print()
    print(f"## gpu_train: {', '.join(args.models)} on {torch.cuda.get_device_name(0)}")
    print()
    print("\n".join(header))
    print(f"- data: {data_line}")
    print(
        f"- batch {args.batch}, bf16 autocast, channels_last, SGD (momentum 0.9), normalised on the GPU; "
        f"{args.epochs} epochs per measurement (start-up included), steady rate from epochs 2..{args.epochs}; "
        f"{args.rounds} interleaved rounds, medians; DataLoader num_workers={cores}, pin_memory=True"
    )
    print(f"- GPU utilization (mean over epochs 2..{args.epochs}, medians of the rounds): {util_how}")
    for text in sections:
        print()
        print(text)
    return 0


def section(
    model: str,
    rows: Mapping[str, Row],
    gpu_limit: float,
    gpu_limits: Sequence[float],
    decode_limit: float,
    limits: Mapping[str, tuple[float, float]],
    cores: int,
    gpu_utils: Sequence[float] = (),
) -> str:
    """The report of one model: the main table, then the trainer's CPU by thread.
    ``gpu_utils``: the GPU's utilization during gpu-limit, per round."""
    peer = rows.get("dataloader")
    peer_rate = median(r.rate for r in peer.results) if peer and peer.results else float("nan")
    headers = [
        "loader",
        "img/s (steady)",
        "per round",
        "vs DataLoader",
        "share of gpu-limit",
        "GPU util",
        "share of decode-limit",
        "start-up s (first batch)",
        "trainer CPU ms/batch",
        "tree CPU s/batch",
        "decoded on",
    ]
    dash = "-"
    table = []
    for row in rows.values():
        if not row.results:
            table.append([row.name, row.unavailable or "not run", *[dash] * (len(headers) - 2)])
            continue
        rate = median(r.rate for r in row.results)
        counts = row.results[-1].device_decode
        table.append(
            [
                row.name,
                fmt(rate),
                ", ".join(fmt(r.rate) for r in row.results),
                fmt(ratio(rate, peer_rate), ".2f", "x"),
                fmt(ratio(rate, gpu_limit), ".0%"),
                util_cell(r.gpu_util for r in row.results),
                fmt(ratio(rate, decode_limit), ".0%"),
                fmt(median(r.first_batch for r in row.results), ".2f"),
                fmt(median(r.trainer_cpu / max(r.batches, 1) * 1e3 for r in row.results), ".0f"),
                fmt(median(r.tree_cpu / max(r.batches, 1) for r in row.results), ".2f"),
                decode_share_cell(counts) if row.name == "aioloader-gpu" else "CPU",
            ]
        )
        if row.unavailable:  # failed in a later round
            table[-1][-1] += f" ({row.unavailable})"
    table.append(
        ["gpu-limit (batch on the GPU)", fmt(gpu_limit), ", ".join(fmt(v) for v in gpu_limits), dash, dash]
        + [util_cell(gpu_utils)]
        + [dash] * (len(headers) - 6)
    )
    for name, (rate, single) in limits.items():
        label = f"decode-limit, {name}: {cores} processes (1 core x {cores}: {single * cores:.0f})"
        table.append([label, fmt(rate)] + [dash] * (len(headers) - 2))
    threads_rows = []
    for row in rows.values():
        if not row.results:
            continue
        groups = {k for r in row.results for k in r.threads}
        med = {g: median(r.threads.get(g, 0.0) / max(r.batches, 1) for r in row.results) for g in groups}
        threads_rows.append([row.name, threads_cell(med, 1)])
    out = [f"### {model}", "", markdown_table(headers, table)]
    if threads_rows:
        out += ["", f"{model}: trainer-process CPU ms per batch by thread (medians)", ""]
        out.append(markdown_table(["loader", "ms/batch by thread"], threads_rows))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
