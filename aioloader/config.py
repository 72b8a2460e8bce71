"""Validated loader settings: a plain frozen dataclass, checked without any I/O.

Every argument error names the argument and shows the value, e.g.
``batch_size=0 must be a positive integer``.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from aioloader.base import sendable
from aioloader.base.cpus import cpu_quota
from aioloader.base.semnames import import_loky_cpu_count
from aioloader.read.backends import StorageBackend, resolve

__all__ = [
    "AUTO_IO_START",
    "DecodeOn",
    "LoaderConfig",
    "LoaderProcess",
    "resolve_device",
    "resolve_rank",
    "usable_cpus",
]

logger = logging.getLogger("aioloader")

OnError = Literal["raise", "skip"]
#: ``decode_on``: where the decode runs.
DecodeOn = Literal["local", "ray"]
#: ``loader_process``: ``"auto"`` (a loader process wherever one can be made), True or False.
LoaderProcess = bool | Literal["auto"]
#: Reads in flight an ``io_concurrency="auto"`` loader starts with (:mod:`aioloader.tune.rules` moves it).
AUTO_IO_START = 64


def usable_cpus() -> int:
    """The CPUs this process may really use: its CPU affinity, lowered to the CPU quota of its
    own cgroup and of each ancestor (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``; the smallest binds), rounded up, at least 1. A pod limited to 4
    CPUs on a 64-core node gets 4; a quota of 1.5 CPUs gets 2.

    The one count of usable CPUs: ``num_workers=None`` and ``"auto"`` start this many
    processes, the autotuner (:mod:`aioloader.tune.tuner`) shares them with the trainer, and ``aioloader
    bench``, the demo and the benchmarks use it.

    The minimum of two counts. loky's ``cpu_count()``: ``os.cpu_count()``, the affinity,
    ``LOKY_MAX_CPU_COUNT`` when set (it lowers the count, never raises it), and the quota at
    the root of the hierarchy this process sees (``/sys/fs/cgroup``), which is the container's
    own cgroup in Docker or Kubernetes. And :func:`aioloader.base.cpus.cpu_quota`: the quotas
    of the cgroup ``/proc/self/cgroup`` names and its ancestors, found through
    ``/proc/self/mountinfo``, for a process put into a nested cgroup without a namespace of
    its own (``systemd-run -p CPUQuota=``, Slurm), where the root has none. Without ``/proc``
    (not Linux), loky's count alone.
    """
    count = _loky_cpu_count()
    quota = cpu_quota()
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)


def _loky_cpu_count() -> int:
    return int(import_loky_cpu_count()())


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return value


def _non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be a non-negative integer")
    return value


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device batches are delivered on; refuses CUDA when this machine has none."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a valid torch device") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} needs CUDA, but torch.cuda.is_available() is False")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise ValueError(f"device={device!r}: only 'cpu' and 'cuda[:N]' are supported")
    return dev


def resolve_rank(rank: object, world_size: object) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else torch.distributed's when a process group is
    initialised, else ``(0, 1)``."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        else:
            rank = 0 if rank is None else rank
            world_size = 1 if world_size is None else world_size
    ws = _positive_int("world_size", world_size)
    r = _non_negative_int("rank", rank)
    if r >= ws:
        raise ValueError(f"rank={r} must be below world_size={ws}")
    return r, ws


@dataclass(frozen=True)
class LoaderConfig:
    """Every setting of a :class:`~aioloader.Loader`, validated (see ``Loader`` for meanings)."""

    batch_size: int
    decode: Callable[[bytes], Any] | None
    collate: Callable[[list[Any]], Any] | None
    shuffle: bool
    seed: int
    drop_last: bool
    num_workers: int
    io_concurrency: int
    prefetch: int
    ordered: bool
    device: torch.device
    pin_memory: bool
    on_error: OnError
    max_failures: int | float | None
    read: Callable[[str], bytes] | None = None
    zero_copy: bool = True
    read_retries: int = 2
    sample_timeout: float | None = None
    max_worker_restarts: int = 3
    rank: int = 0
    world_size: int = 1
    pad_shards: bool = True
    #: Whether this loader starts in a loader process: ``loader_process=True``, or ``"auto"``
    #: with ``read`` and ``collate`` sendable. Where no zygote can be made it loads
    #: in-process all the same (:mod:`aioloader.run.start`).
    loader_process: bool = False
    #: ``loader_process="auto"``: a loader process that cannot be made, or callables that
    #: cannot be sent there, mean in-process without a warning.
    process_auto: bool = False
    #: fsspec options for remote URLs; never shown (credentials).
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    #: the client of remote reads (:mod:`aioloader.read.backends`).
    storage_backend: StorageBackend = "auto"
    #: where samples are decoded: ``"local"`` (worker processes of this machine) or ``"ray"``
    #: (tasks on the connected Ray cluster, :mod:`aioloader.cluster`).
    decode_on: DecodeOn = "local"
    #: ``decode_on="ray"``: Ray tasks decoding at once (``num_workers``); None: as many as the
    #: cluster has CPUs when the loader starts.
    cluster_tasks: int | None = None
    #: a progress bar per epoch (:mod:`aioloader.observe.progressbar`).
    progress: bool | Literal["always"] = False
    #: ``io_concurrency="auto"``: ``io_concurrency`` is where the tuner starts.
    io_auto: bool = False
    #: ``num_workers="auto"``: ``num_workers`` processes, of which the tuner lets some decode.
    workers_auto: bool = False
    #: The callables that run in other processes, pickled by value once (:mod:`aioloader.base.sendable`):
    #: ``decode`` always, ``read`` and ``collate`` when ``loader_process`` is True.
    sent: Mapping[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        # A config crosses to the loader process with its callables as the blobs made when
        # it was created: by value, so that process never needs the trainer's __main__.
        state = dict(self.__dict__)
        for name in self.sent:
            state[name] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, blob in state["sent"].items():
            state[name] = sendable.loads(blob, name)
        self.__dict__.update(state)  # frozen: no setattr, and __init__ would check again

    @property
    def autotuned(self) -> bool:
        return self.io_auto or self.workers_auto

    @property
    def loader_process_asked(self) -> LoaderProcess:
        """``loader_process`` as it was given: ``"auto"``, True or False."""
        return "auto" if self.process_auto else self.loader_process

    @classmethod
    def create(
        cls,
        *,
        batch_size: object,
        decode: object,
        collate: object,
        shuffle: object,
        seed: object,
        drop_last: object,
        num_workers: object,
        io_concurrency: object,
        prefetch: object,
        ordered: object,
        device: object,
        pin_memory: object,
        on_error: object,
        max_failures: object,
        read: object = None,
        zero_copy: object = True,
        read_retries: object = 2,
        sample_timeout: object = None,
        max_worker_restarts: object = 3,
        rank: object = None,
        world_size: object = None,
        pad_shards: object = True,
        loader_process: object = "auto",
        storage_options: object = None,
        storage_backend: object = "auto",
        progress: object = False,
        decode_on: object = "local",
    ) -> LoaderConfig:
        """Check every argument and return the settings, or raise ``ValueError``/``TypeError``."""
        bs = _positive_int("batch_size", batch_size)
        if decode is not None and not callable(decode):
            raise TypeError(f"decode={decode!r} must be callable (bytes -> sample) or None")
        if read is not None and not callable(read):
            raise TypeError(f"read={read!r} must be callable (path -> bytes) or None")
        if collate is not None and not callable(collate):
            raise TypeError(f"collate={collate!r} must be callable (list of samples -> batch)")
        flags = (
            ("shuffle", shuffle),
            ("drop_last", drop_last),
            ("ordered", ordered),
            ("zero_copy", zero_copy),
            ("pad_shards", pad_shards),
        )
        for name, flag in flags:
            if not isinstance(flag, bool):
                raise TypeError(f"{name}={flag!r} must be True or False")
        if not (isinstance(loader_process, bool) or loader_process == "auto"):
            raise ValueError(f"loader_process={loader_process!r} must be 'auto', True or False")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be a non-negative integer")
        on_ray = _check_decode_on(decode_on, decode, num_workers, loader_process)
        if on_ray:
            loader_process = False  # the Ray connection is the trainer's process's
        workers_auto = num_workers == "auto"
        if num_workers is None or workers_auto:
            workers = usable_cpus()
        elif isinstance(num_workers, str):
            raise ValueError(f"num_workers={num_workers!r} must be a positive integer, 'auto' or None")
        else:
            workers = _positive_int("num_workers", num_workers)
        io_auto = io_concurrency == "auto"
        if io_auto:
            io = AUTO_IO_START
        elif isinstance(io_concurrency, str):
            raise ValueError(f"io_concurrency={io_concurrency!r} must be a positive integer or 'auto'")
        else:
            io = _positive_int("io_concurrency", io_concurrency)
        pre = _positive_int("prefetch", prefetch)
        if not (device is None or isinstance(device, (str, torch.device))):
            raise TypeError(f"device={device!r} must be None, a string or a torch.device")
        dev = resolve_device(device)
        if pin_memory is not None and not isinstance(pin_memory, bool):
            raise TypeError(f"pin_memory={pin_memory!r} must be True, False or None")
        # Pinned staging only means something for a CUDA copy; elsewhere it is ignored.
        pin = dev.type == "cuda" and (pin_memory is None or pin_memory)
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r} must be 'raise' or 'skip'")
        if max_failures is not None:
            if on_error != "skip":
                raise ValueError(f"max_failures={max_failures!r} needs on_error='skip'")
            if isinstance(max_failures, bool) or not isinstance(max_failures, (int, float)):
                raise TypeError(f"max_failures={max_failures!r} must be an int count or a float fraction")
            if isinstance(max_failures, int) and max_failures < 0:
                raise ValueError(f"max_failures={max_failures!r} must be >= 0")
            if isinstance(max_failures, float) and not 0.0 <= max_failures <= 1.0:
                raise ValueError(f"max_failures={max_failures!r} as a fraction must be in [0, 1]")
        retries = _non_negative_int("read_retries", read_retries)
        restarts = _non_negative_int("max_worker_restarts", max_worker_restarts)
        if sample_timeout is not None and (
            isinstance(sample_timeout, bool)
            or not isinstance(sample_timeout, (int, float))
            or sample_timeout <= 0
        ):
            raise ValueError(
                f"sample_timeout={sample_timeout!r} must be a positive number of seconds or None"
            )
        the_rank, the_world = resolve_rank(rank, world_size)
        if storage_options is not None and not isinstance(storage_options, Mapping):
            # The type only: the value may hold credentials.
            raise TypeError(
                f"storage_options must be a dict (fsspec's options, or one per protocol), "
                f"got {type(storage_options).__name__}"
            )
        if progress not in (True, False, "always") or not isinstance(progress, (bool, str)):
            raise ValueError(f"progress={progress!r} must be True, False or 'always'")
        sent = {}
        if decode is not None and on_ray:
            sent["decode"] = sendable.dumps(decode, "decode", "the Ray cluster's workers", elsewhere=True)
        elif decode is not None:
            sent["decode"] = sendable.dumps(decode, "decode", "the decode worker processes")
        process_auto = loader_process == "auto"
        process = loader_process is True or process_auto
        if process:
            try:
                for name, value in (("read", read), ("collate", collate)):
                    if value is not None:
                        where = f"the loader process (loader_process={loader_process!r})"
                        sent[name] = sendable.dumps(value, name, where)
            except ValueError as exc:
                # "auto" runs them in-process, where they need not be sent; obstore would
                # then be refused below with a reason less to the point than this one.
                if not process_auto or storage_backend == "obstore":
                    raise
                logger.debug("loader_process='auto': loading in-process: %s", exc)
                process = False
                sent.pop("read", None)
        backend = resolve(storage_backend, process)
        return cls(
            batch_size=bs,
            decode=decode,
            collate=collate,
            shuffle=bool(shuffle),
            seed=int(seed),
            drop_last=bool(drop_last),
            num_workers=workers,
            io_concurrency=io,
            prefetch=pre,
            ordered=bool(ordered),
            device=dev,
            pin_memory=pin,
            on_error=on_error,
            max_failures=max_failures,
            read=read,
            zero_copy=bool(zero_copy),
            read_retries=retries,
            sample_timeout=None if sample_timeout is None else float(sample_timeout),
            max_worker_restarts=restarts,
            rank=the_rank,
            world_size=the_world,
            pad_shards=bool(pad_shards),
            loader_process=process,
            process_auto=process_auto,
            storage_options=dict(storage_options) if storage_options is not None else None,
            storage_backend=backend,
            progress=progress,
            io_auto=io_auto,
            workers_auto=workers_auto,
            sent=sent,
            decode_on="ray" if on_ray else "local",
            cluster_tasks=(workers if num_workers is not None else None) if on_ray else None,
        )


def _check_decode_on(decode_on: object, decode: object, num_workers: object, loader_process: object) -> bool:
    """Whether ``decode_on`` is ``"ray"``; a ``ValueError`` naming the argument for what
    cannot go with it, an ``ImportError`` naming the extra without Ray installed."""
    if decode_on not in ("local", "ray") or not isinstance(decode_on, str):
        raise ValueError(f"decode_on={decode_on!r} must be 'local' or 'ray'")
    if decode_on == "local":
        return False
    if decode is None:
        raise ValueError("decode_on='ray' needs a decode function (decode=None: nothing to decode)")
    if num_workers == "auto":
        raise ValueError(
            "num_workers='auto' cannot go with decode_on='ray': give the Ray tasks to run at once, "
            "or None for as many as the cluster has CPUs"
        )
    if loader_process is True:
        raise ValueError(
            "loader_process=True cannot go with decode_on='ray': the loader submits its Ray tasks "
            "from the trainer's process, which holds the Ray connection (leave loader_process='auto')"
        )
    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a module without a spec
        found = False
    if not found:
        raise ImportError("decode_on='ray' needs Ray: pip install 'aioloader[ray]'")
    return True
