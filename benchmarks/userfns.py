"""What a user's training script would define, shared by the benchmarks: decode functions in
the forms users write them, the DataLoader peer's Dataset, small-file generation and CPU
accounting of a process tree.

The decode functions are module-level so both loaders can pickle them: aioloader's decode
workers import this module (the fork server preloads it, as the main script imports it),
DataLoader's forked workers inherit it. Each takes an optional ``rng``: aioloader calls it
with the bytes alone and the randomness comes from :func:`aioloader.sample_rng`; the
DataLoader peer passes a per-worker NumPy generator.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, get_worker_info

from aioloader import FileDataset, sample_rng

SIZE = 224


def random_crop(data: bytes, rng: np.random.Generator | None = None) -> np.ndarray:
    """A plain user decode: Pillow decode, a RandomResizedCrop-like box (scale 0.08-1,
    ratio 3/4-4/3, 10 tries then the centre) resized to 224x224, horizontal flip p=0.5,
    uint8 CHW. No draft mode, nothing declared."""
    rng = sample_rng() if rng is None else rng
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    box = (0.0, 0.0, float(w), float(h))
    for _ in range(10):
        area = w * h * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        bw, bh = math.sqrt(area * aspect), math.sqrt(area / aspect)
        if bw <= w and bh <= h:
            x0, y0 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            box = (x0, y0, x0 + bw, y0 + bh)
            break
    out = img.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=box)
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.ascontiguousarray(np.asarray(out, dtype=np.uint8).transpose(2, 0, 1))


class DeclaredCrop:
    """``random_crop`` wrapped in a picklable callable that declares its output."""

    output_shape = (3, SIZE, SIZE)
    output_dtype = np.uint8

    def __call__(self, data: bytes, rng: np.random.Generator | None = None) -> np.ndarray:
        return random_crop(data, rng)


def random_crop_tensor(data: bytes, rng: np.random.Generator | None = None) -> torch.Tensor:
    """``random_crop`` returning a torch tensor."""
    return torch.from_numpy(random_crop(data, rng))


def random_crop_dict(data: bytes, rng: np.random.Generator | None = None) -> dict[str, Any]:
    """``random_crop`` returning a nested dict: ``{"image": array, "meta": {"h", "w"}}``
    (the file's own size)."""
    image = random_crop(data, rng)
    w, h = Image.open(io.BytesIO(data)).size  # header only
    return {"image": image, "meta": {"h": int(h), "w": int(w)}}


def read_file(path: str) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.readall()


class TimedRead:
    """Read a whole file after sleeping ``delay_ms`` (0: no sleep). Stateless, so it is
    thread-safe (aioloader's ``read=`` hook) and picklable (DataLoader workers)."""

    def __init__(self, delay_ms: float) -> None:
        self.delay_s = delay_ms / 1e3

    def __call__(self, path: str) -> bytes:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return read_file(path)


class FsspecRead:
    """What users write today to read a URL inside ``Dataset.__getitem__``: fsspec's blocking
    ``cat_file`` (one request at a time per worker). The filesystem is made in the process
    that first reads (a DataLoader worker), never shared across a fork."""

    def __init__(self, protocol: str = "http", **options: Any) -> None:
        self.protocol, self.options = protocol, options
        self._fs: Any = None
        self._pid = 0

    def __call__(self, url: str) -> bytes:
        if self._fs is None or self._pid != os.getpid():
            import fsspec

            self._fs, self._pid = (
                fsspec.filesystem(self.protocol, skip_instance_cache=True, **self.options),
                os.getpid(),
            )
        data: bytes = self._fs.cat_file(url)
        return data

    def __getstate__(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "options": self.options, "_fs": None, "_pid": 0}


class PeerDataset(Dataset[Any]):
    """The DataLoader peer's Dataset: read + decode in the worker. ``decode(data, rng)`` gets
    a NumPy generator per worker when ``takes_rng`` (the user functions), else
    ``decode(data)`` (``ImageDecoder``, which draws from ``sample_rng()``); ``decode=None``
    returns the bytes. Samples are ``(decoded, label)`` when the files have labels."""

    def __init__(
        self,
        files: FileDataset,
        decode: Callable[..., Any] | None,
        read: Callable[[str], bytes] = read_file,
        takes_rng: bool = True,
        seed: int = 0,
    ) -> None:
        self.files, self.decode, self.read, self.takes_rng, self.seed = files, decode, read, takes_rng, seed
        self._rng: np.random.Generator | None = None

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> Any:
        path, label = self.files[index]
        data = self.read(path)
        if self.decode is None:
            sample = data
        elif self.takes_rng:
            if self._rng is None:
                info = get_worker_info()
                self._rng = np.random.default_rng([self.seed, info.id if info else 0, os.getpid()])
            sample = self.decode(data, self._rng)
        else:
            sample = self.decode(data)
        return sample if label is None else (sample, label)


def make_small_files(root: Path, count: int, size: int = 4096, seed: int = 0) -> FileDataset:
    """``count`` files of ``size`` random bytes under ``root`` (1,000 per folder), made once
    (marked by ``.complete``), read once to warm the page cache. No labels."""
    marker = root / ".complete"
    stamp = f"{count} x {size} seed{seed}"
    paths = [root / f"{i // 1000:04d}" / f"f{i:07d}.bin" for i in range(count)]
    if not (marker.is_file() and marker.read_text() == stamp):
        rng = np.random.default_rng(seed)
        for i, p in enumerate(paths):
            if i % 1000 == 0:
                p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(rng.bytes(size))
        marker.write_text(stamp)
    for p in paths:
        read_file(str(p))
    return FileDataset([str(p) for p in paths])


def batch_len(batch: Any) -> int:
    """Samples in a batch: ``(samples, labels)`` (DataLoader makes it a list), a list of
    raw samples (bytes), a tensor, or a dict."""
    if isinstance(batch, (tuple, list)) and batch and not isinstance(batch[0], (bytes, str)):
        return batch_len(batch[-1])
    if isinstance(batch, dict):
        return batch_len(next(iter(batch.values())))
    return len(batch)


def touch(batch: Any) -> int:
    """Read one byte of every 4 KiB page of every array in ``batch``, as a trainer's step
    (a copy to the GPU, a forward pass) reads all of it; returns the bytes' sum.

    A batch in shared memory that the trainer never reads has no page in the trainer's page
    tables, so ``smaps`` charges it to no process: DataLoader's batches (its workers unmap
    them once sent) would be missing from a whole tree's PSS, and the memory measured would
    not be what users run."""
    if isinstance(batch, torch.Tensor):
        flat = (
            batch.reshape(-1).view(torch.uint8)
            if batch.is_contiguous()
            else batch.contiguous().reshape(-1).view(torch.uint8)
        )
        return int(flat[::4096].sum()) if flat.numel() else 0
    if isinstance(batch, np.ndarray):
        return touch(torch.from_numpy(np.ascontiguousarray(batch)))
    if isinstance(batch, dict):
        return sum(touch(v) for v in batch.values())
    if isinstance(batch, (tuple, list)):
        return sum(touch(v) for v in batch if not isinstance(v, (bytes, str, int, float)))
    return 0


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu() -> float:
    """User + system CPU seconds of this process and of every process under it, alive or
    already reaped (Linux ``/proc``; clock-tick resolution, 10 ms).

    A process's ``cutime``/``cstime`` hold the CPU of the children it has waited for (and
    theirs), so summing ``utime + stime + cutime + cstime`` over the live tree counts every
    descendant exactly once, including aioloader's decode workers, which are children of
    the fork server (a child of ours), not of this process. ``getrusage(RUSAGE_CHILDREN)``
    alone would miss them until the fork server exits. Returns NaN without ``/proc``."""
    try:
        stats: dict[int, tuple[int, float]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # after "pid (comm)": state ppid ... utime(11) stime(12) cutime(13) cstime(14)
            ppid = int(fields[1])
            stats[int(name)] = (ppid, sum(int(v) for v in fields[11:15]) / _TICK)
    except OSError:
        return float("nan")
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo.extend(children.get(pid, ()))
    return total


def descendants(root: int) -> list[int]:
    """``root`` and every process under it, alive now (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid`` (``/proc/<pid>/smaps_rollup``): each shared page
    split between the processes that map it, so shared memory summed over a process tree
    counts once. 0 for a process gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tmpfs_mounts() -> tuple[str, ...]:
    """Mount points of tmpfs file systems (``/dev/shm`` among them), each ending in "/"."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["tmpfs"]:
                    out.append(left.split()[4].rstrip("/") + "/")
    except OSError:
        pass
    return tuple(out)


_SHM_PREFIXES = ("/memfd:", "/dev/zero", "/SYSV", "/dev/shm/")


def tree_memory(pids: Iterable[int]) -> tuple[int, int]:
    """``(pss, whole)`` in bytes for the processes ``pids`` (a process tree).

    ``pss``: the sum of their PSS (``smaps_rollup``), each shared page split between its
    holders. ``whole``: the same without shared-memory pages (``Pss_Shmem``), plus every
    shared-memory object any of them maps or holds an fd of (memfd, ``/dev/shm``, tmpfs,
    shared anonymous), once each, at its allocated size (``st_blocks``). The two differ by
    the pages of shared memory that no process of the tree has touched since mapping them:
    a batch sent by a DataLoader worker (which then unmaps it) and not yet read by the
    trainer is in no page table, so PSS misses it; ``whole`` does not."""
    tmpfs = _tmpfs_mounts()
    pss = non_shm = 0
    objects: dict[tuple[int, int], int] = {}

    def add(path: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        objects[(st.st_dev, st.st_ino)] = st.st_blocks * 512

    for pid in pids:
        fields = {}
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    parts = line.split()
                    if parts[0] in ("Pss:", "Pss_Shmem:"):
                        fields[parts[0]] = int(parts[1]) * 1024
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read().splitlines()
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        pss += fields.get("Pss:", 0)
        non_shm += fields.get("Pss:", 0) - fields.get("Pss_Shmem:", 0)
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[1][3] == "s" and parts[5].startswith(_SHM_PREFIXES + tmpfs):
                add(f"/proc/{pid}/map_files/{parts[0]}")  # root: the object even if unlinked
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith(_SHM_PREFIXES + tmpfs):
                add(f"/proc/{pid}/fd/{fd}")
    return pss, non_shm + sum(objects.values())


class TreePss(threading.Thread):
    """Samples the PSS of this process and all its descendants every ``every`` seconds
    while running; ``peak`` is the largest sum seen (bytes), ``cpu`` the CPU seconds the
    sampling itself cost (subtract it from the measured process's CPU)."""

    def __init__(self, every: float = 0.02) -> None:
        super().__init__(name="pss-sampler", daemon=True)
        self.every = every
        self.peak = 0
        self.cpu = 0.0
        self._stop_event = threading.Event()

    def run(self) -> None:
        me = os.getpid()
        while True:
            self.peak = max(self.peak, sum(pss_bytes(p) for p in descendants(me)))
            self.cpu = time.thread_time()
            if self._stop_event.wait(self.every):
                return

    def __enter__(self) -> TreePss:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_event.set()
        self.join()


def trivial_decode(data: bytes) -> np.ndarray:
    """Next to no work: the file's first 16 bytes as a uint8 array."""
    return np.frombuffer(data, dtype=np.uint8, count=16).copy()


def add_folder_args(p: argparse.ArgumentParser) -> None:
    """``--data-dir`` and ``--images``: where the benchmark's JPEG folder is cached, and its size."""
    env = os.environ.get("AIOLOADER_CACHE")
    cache = (Path(env).expanduser() if env else Path.home() / ".cache" / "aioloader") / "bench"
    p.add_argument("--data-dir", type=Path, default=cache, help="(%(default)s)")
    p.add_argument("--images", type=int, default=2000)


def image_folder(args: argparse.Namespace) -> Path:
    """The folder of ``args.images`` JPEGs of 500x375 in 10 classes (made once, then reused)."""
    from aioloader.synthetic import make_image_folder

    folder = Path(args.data_dir) / f"{args.images}img_10cls_500x375"
    return make_image_folder(folder, num_images=args.images, num_classes=10, size=(500, 375))


def git_describe(folder: Path) -> str:
    """``git describe --always --dirty`` of the checkout ``folder`` is in, or "unknown"."""
    try:
        return subprocess.run(
            ["git", "-C", str(folder), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
