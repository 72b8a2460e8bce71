"""Validated loader settings: a plain frozen dataclass, made without any I/O by
:meth:`LoaderConfig.create` in two steps. Each argument is checked on its own by a plain
function of :mod:`aioloader.arguments` (every error names the argument and shows the value,
e.g. ``batch_size=0 must be a positive integer``); then the two policies are settled here:
where the pipeline starts (:func:`choose_runtime`) and which callables are pickled, once, for
the processes that run them (:func:`send_decode`, and ``read`` and ``collate`` with the
runtime).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from aioloader.arguments import (
    Arguments,
    DecodeOn,
    LoaderProcess,
    OnError,
    Progress,
    check_cache,
    check_callables,
    check_decode_on,
    check_device,
    check_device_decode,
    check_failures,
    check_flags,
    check_io_concurrency,
    check_loader_process,
    check_num_workers,
    check_progress,
    check_sample_timeout,
    check_storage_options,
    non_negative_int,
    positive_int,
    resolve_device,
    resolve_rank,
)
from aioloader.base import sendable
from aioloader.base.cpus import cpu_quota
from aioloader.base.semnames import import_loky_cpu_count
from aioloader.cache.settings import Cache
from aioloader.decode.ondevice import decodes_on_device
from aioloader.plan.node import cpus_per_rank, node_ranks
from aioloader.read.backends import StorageBackend, resolve

__all__ = [
    "AUTO_IO_START",
    "DecodeOn",
    "LoaderConfig",
    "LoaderProcess",
    "OnError",
    "Where",
    "choose_runtime",
    "resolve_device",
    "resolve_rank",
    "send_decode",
    "usable_cpus",
]

logger = logging.getLogger("aioloader")

#: Where a loader's pipeline runs: a loader process, or the ``aioloader-loop`` thread of the
#: trainer's process.
Where = Literal["process", "thread"]
#: Reads in flight an ``io_concurrency="auto"`` loader starts with (:mod:`aioloader.tune.rules` moves it).
AUTO_IO_START = 64


def usable_cpus() -> int:
    """The CPUs this process may really use: its CPU affinity, lowered to the CPU quota of its
    own cgroup and of each ancestor (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``; the smallest binds), rounded up, at least 1. A pod limited to 4
    CPUs on a 64-core node gets 4; a quota of 1.5 CPUs gets 2.

    The one count of usable CPUs: divided among the ranks of the node
    (:func:`aioloader.plan.node.cpus_per_rank`, ``LoaderConfig.cpus_per_rank``), it is what
    ``num_workers=None`` and ``"auto"`` start, what the autotuner (:mod:`aioloader.tune.tuner`)
    shares with the trainer and what reader processes are counted against; ``aioloader
    bench``, the demo and the benchmarks use it whole.

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


@dataclass(frozen=True)
class LoaderConfig:
    """Every setting of a :class:`~aioloader.Loader`, validated (see ``Loader`` for meanings),
    and what :meth:`create` settled from them (``start_in``, ``io_auto``, ``workers_auto``,
    ``cluster_tasks``, ``sent``)."""

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
    #: ``loader_process`` as given: ``"auto"``, True or False.
    loader_process: LoaderProcess = False
    #: Where the loader starts its pipeline (:func:`choose_runtime`): ``"process"`` for
    #: ``loader_process="auto"`` or True, unless ``decode_on="ray"`` or, under ``"auto"``,
    #: a ``read`` or ``collate`` that cannot be sent. Where no zygote can be made, a
    #: ``"process"`` loader runs on the thread all the same (:mod:`aioloader.run.start`;
    #: ``Loader.runtime`` says where it ran).
    start_in: Where = "thread"
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
    progress: Progress = False
    #: the sample cache (:mod:`aioloader.cache`), or None.
    cache: Cache | None = None
    #: ``io_concurrency="auto"``: ``io_concurrency`` is where the tuner starts.
    io_auto: bool = False
    #: ``num_workers="auto"``: ``num_workers`` processes, of which the tuner lets some decode.
    workers_auto: bool = False
    #: The processes on this node (``LOCAL_WORLD_SIZE``; under ``srun``, its tasks on the
    #: node), 1 without a launcher (:func:`aioloader.plan.node.node_ranks`).
    ranks_on_node: int = 1
    #: This rank's part of the node's usable CPUs (:func:`aioloader.plan.node.cpus_per_rank`):
    #: the default ``num_workers``, the tuner's CPUs, the reader processes' bound.
    cpus_per_rank: int = 1
    #: The callables that run in other processes, pickled by value once (:mod:`aioloader.base.sendable`):
    #: ``decode`` always, ``read`` and ``collate`` when the loader starts in a loader process.
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
        if "start_in" not in state:
            _one_name_for_loader_process(state)
        self.__dict__.update(state)  # frozen: no setattr, and __init__ would check again

    @property
    def autotuned(self) -> bool:
        return self.io_auto or self.workers_auto

    @property
    def decodes_on_device(self) -> bool:
        """``ImageDecoder(device=...)``: the bridging thread decodes each batch on the device."""
        return decodes_on_device(self.decode)

    @classmethod
    def create(cls, remote: bool = False, **given: object) -> LoaderConfig:
        """The settings of ``Loader(**given)`` (the names of :class:`~aioloader.arguments.Arguments`;
        ``remote``: whether the dataset's files are URLs),
        or a ``ValueError``/``TypeError`` for the first argument found wrong: each is checked
        by a plain function of :mod:`aioloader.arguments`, in this order, then the policies
        are settled (:func:`send_decode`, :func:`choose_runtime`)."""
        a = Arguments(**given)
        batch_size = positive_int("batch_size", a.batch_size)
        decode, read, collate = check_callables(a.decode, a.read, a.collate)
        check_flags(a)
        loader_process = check_loader_process(a.loader_process)
        seed = non_negative_int("seed", a.seed)
        on_ray = check_decode_on(a.decode_on, decode, a.num_workers, loader_process)
        node = node_ranks(os.environ)
        cpus = cpus_per_rank(usable_cpus(), node)
        workers, workers_auto = check_num_workers(a.num_workers, lambda: cpus)
        io, io_auto = check_io_concurrency(a.io_concurrency, AUTO_IO_START)
        prefetch = positive_int("prefetch", a.prefetch)
        device, pin_memory = check_device(a.device, a.pin_memory)
        check_device_decode(decode, device, collate, on_ray)
        on_error, max_failures = check_failures(a.on_error, a.max_failures)
        read_retries = non_negative_int("read_retries", a.read_retries)
        max_worker_restarts = non_negative_int("max_worker_restarts", a.max_worker_restarts)
        sample_timeout = check_sample_timeout(a.sample_timeout)
        rank, world_size = resolve_rank(a.rank, a.world_size)
        storage_options = check_storage_options(a.storage_options)
        progress = check_progress(a.progress)
        cache = check_cache(a.cache, decode, on_ray)
        sent = send_decode(decode, on_ray)
        start_in, sent_there = choose_runtime(
            loader_process,
            on_ray,
            read,
            collate,
            a.storage_backend,
            plain=decode is None and read is None and not remote,
        )
        return cls(
            batch_size=batch_size,
            decode=decode,
            collate=collate,
            shuffle=bool(a.shuffle),
            seed=seed,
            drop_last=bool(a.drop_last),
            num_workers=workers,
            io_concurrency=io,
            prefetch=prefetch,
            ordered=bool(a.ordered),
            device=device,
            pin_memory=pin_memory,
            on_error=on_error,
            max_failures=max_failures,
            read=read,
            zero_copy=bool(a.zero_copy),
            read_retries=read_retries,
            sample_timeout=sample_timeout,
            max_worker_restarts=max_worker_restarts,
            rank=rank,
            world_size=world_size,
            pad_shards=bool(a.pad_shards),
            loader_process=loader_process,
            start_in=start_in,
            storage_options=storage_options,
            storage_backend=resolve(a.storage_backend, start_in == "process"),
            progress=progress,
            io_auto=io_auto,
            workers_auto=workers_auto,
            ranks_on_node=node.ranks,
            cpus_per_rank=cpus,
            sent={**sent, **sent_there},
            decode_on="ray" if on_ray else "local",
            cluster_tasks=(workers if a.num_workers is not None else None) if on_ray else None,
            cache=cache,
        )


def send_decode(decode: Callable[[bytes], Any] | None, on_ray: bool) -> dict[str, bytes]:
    """``decode`` pickled by value, once, for the processes that run it: the decode workers,
    or the Ray cluster's (``on_ray``); a ``ValueError`` naming it if it cannot be sent."""
    if decode is None:
        return {}
    if on_ray:
        return {"decode": sendable.dumps(decode, "decode", "the Ray cluster's workers", elsewhere=True)}
    return {"decode": sendable.dumps(decode, "decode", "the decode worker processes")}


def choose_runtime(
    loader_process: LoaderProcess,
    on_ray: bool,
    read: Callable[[str], bytes] | None,
    collate: Callable[[list[Any]], Any] | None,
    storage_backend: object,
    plain: bool = False,
) -> tuple[Where, dict[str, bytes]]:
    """Where the pipeline starts, and what must be sent there for it.

    ``"thread"`` for ``loader_process=False``, and with ``decode_on="ray"`` (``on_ray``):
    the Ray connection is the trainer's process's. Else ``"process"``, with ``read`` and
    ``collate`` pickled by value for the loader process. One that cannot be sent is a
    ``ValueError`` naming it under ``loader_process=True``, and with obstore (which reads
    only in a loader process); under ``"auto"`` it keeps the loader in-process, where it
    need not be sent (a DEBUG line). Under ``"auto"``, ``plain`` loading (local files read by
    the library, ``decode=None``) is in-process too, unless obstore was asked for: there is
    nothing to take off the trainer's GIL but fast reads, and a loader process would copy
    every file's bytes once more, through a socket, to the trainer (small files: 0.43x the
    in-process rate, RESULTS §32). Slow storage (a URL, a ``read``) keeps the loader process,
    whose reads cost the trainer no CPU (RESULTS §24)."""
    if on_ray or loader_process is False:
        return "thread", {}
    if loader_process == "auto" and plain and storage_backend != "obstore":
        return "thread", {}
    sent = {}
    try:
        for name, value in (("read", read), ("collate", collate)):
            if value is not None:
                where = f"the loader process (loader_process={loader_process!r})"
                sent[name] = sendable.dumps(value, name, where)
    except ValueError as exc:
        # obstore would be refused in-process with a reason less to the point than this one.
        if loader_process is True or storage_backend == "obstore":
            raise
        logger.debug("loader_process='auto': loading in-process: %s", exc)
        return "thread", {}
    return "process", sent


def _one_name_for_loader_process(state: dict[str, Any]) -> None:
    """A config pickled before ``loader_process`` had one name: ``loader_process`` held the
    choice settled (a bool) and ``process_auto`` whether ``"auto"`` was given (absent before
    ``"auto"`` existed). Now the value as given and ``start_in``."""
    state["start_in"] = "process" if state.get("loader_process") else "thread"
    if state.pop("process_auto", False):
        state["loader_process"] = "auto"
