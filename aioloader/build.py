"""What building a loader decides, once, from its parts' settings and this machine
(:class:`Build`), and the checks only the parts together can make.

- :func:`usable_cpus`: the CPUs this process may use; this rank's part of them is the
  default number of workers.
- :func:`check_together`: a device decode and the delivery's device, Ray and a loader
  process, a cache's ``max_side`` and the decode.
- :func:`decide`: the workers, where the pipeline starts (:func:`choose_runtime`) and the
  client of its remote reads, and the callables pickled for other processes
  (:func:`send_decode`).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from aioloader.base import sendable
from aioloader.base.checks import callable_or_none
from aioloader.base.cpus import cpu_quota
from aioloader.base.semnames import import_loky_cpu_count
from aioloader.cache.settings import Cache
from aioloader.decode.image import ImageDecoder
from aioloader.decode.ondevice import decodes_on_device, device_of
from aioloader.decode.settings import Decoding
from aioloader.engine.settings import Delivery, LoaderProcess
from aioloader.plan.node import cpus_per_rank, node_ranks
from aioloader.read.backends import StorageBackend, resolve
from aioloader.read.settings import Reading
from aioloader.read.tarsample import SampleMembers, WithMembers

__all__ = [
    "Build",
    "Where",
    "check_together",
    "choose_runtime",
    "decide",
    "send_decode",
    "usable_cpus",
    "with_members",
]

logger = logging.getLogger("aioloader")

#: Where a loader's pipeline runs: a loader process, or the ``aioloader-loop`` thread of the
#: trainer's process.
Where = Literal["process", "thread"]


def usable_cpus() -> int:
    """The CPUs this process may really use: its CPU affinity, lowered to the CPU quota of its
    own cgroup and of each ancestor (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``; the smallest binds), rounded up, at least 1. A pod limited to 4
    CPUs on a 64-core node gets 4; a quota of 1.5 CPUs gets 2.

    The one count of usable CPUs: divided among the ranks of the node
    (:func:`aioloader.plan.node.cpus_per_rank`, ``Build.cpus_per_rank``), it is what
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
class Build:
    """What building a loader decided from its settings and this machine, once."""

    #: Where the pipeline starts (:func:`choose_runtime`): ``"process"`` for
    #: ``loader_process="auto"`` or True, unless ``decode_on="ray"`` or, under ``"auto"``,
    #: plain local loading or a ``read`` or ``collate`` that cannot be sent. Where no zygote
    #: can be made, a ``"process"`` loader runs on the thread all the same
    #: (:mod:`aioloader.run.start`; ``Loader.runtime`` says where it ran).
    start_in: Where = "thread"
    #: Decode worker processes (``num_workers``, or this rank's CPUs for None and ``"auto"``).
    workers: int = 1
    #: ``decode_on="ray"``: Ray tasks decoding at once; None: as many as the cluster has CPUs
    #: when the loader starts.
    cluster_tasks: int | None = None
    #: The client of remote reads for where the pipeline starts (:func:`aioloader.read.backends.resolve`).
    storage_backend: StorageBackend = "auto"
    #: The processes on this node (``LOCAL_WORLD_SIZE``; under ``srun``, its tasks on the
    #: node), 1 without a launcher (:func:`aioloader.plan.node.node_ranks`).
    ranks_on_node: int = 1
    #: This rank's part of the node's usable CPUs (:func:`aioloader.plan.node.cpus_per_rank`):
    #: the default number of workers, the tuner's CPUs, the reader processes' bound.
    cpus_per_rank: int = 1
    #: The callables that run in other processes, pickled by value once (:mod:`aioloader.base.sendable`):
    #: ``decode`` always, ``read`` and ``collate`` when the loader starts in a loader process.
    sent: Mapping[str, bytes] = field(default_factory=dict, repr=False, compare=False)


def check_together(decoding: Decoding, delivery: Delivery, cache: object) -> Cache | None:
    """What only the parts together can say: Ray decodes from the trainer's process; an
    ``ImageDecoder(device=...)`` decodes on the loader's device, collated by the default
    collate, on this machine, with its library installed; a ``cache`` is a
    :class:`~aioloader.Cache` whose ``max_side`` needs this machine's decode workers."""
    if decoding.on_ray and delivery.loader_process is True:
        raise ValueError(
            "loader_process=True cannot go with decode_on='ray': the loader submits its Ray tasks "
            "from the trainer's process, which holds the Ray connection (leave loader_process='auto')"
        )
    check_device_decode(decoding.decode, delivery.target, delivery.collate, decoding.on_ray)
    return check_cache(cache, decoding.decode, decoding.on_ray)


def check_device_decode(decode: object, device: torch.device, collate: object, on_ray: bool) -> None:
    """An ``ImageDecoder(device=...)`` decodes on the loader's own device, collated by the
    default collate, on this machine; and for CUDA its library must be installed."""
    where = device_of(decode)
    if where is None:
        return
    named = f"ImageDecoder(device={where!r})"
    asked = torch.device(where)
    if asked.type != device.type or (None not in (asked.index, device.index) and asked != device):
        if asked.type == "cuda" and not torch.cuda.is_available():
            # The real cause: passing device= to the Loader too would only fail there.
            build = "a CPU-only build" if torch.version.cuda is None else "built for CUDA but sees no GPU"
            raise ValueError(
                f"{named} decodes JPEGs on a CUDA GPU, but this machine has none "
                f"(torch.cuda.is_available() is False; torch {torch.__version__} is {build}): "
                f"leave device= out to decode on the CPU, in the worker processes"
            )
        raise ValueError(f"{named} decodes on the loader's device, but the loader's is {str(device)!r}")
    if collate is not None:
        raise ValueError(f"{named} makes its batches itself: it needs the default collate, not {collate!r}")
    if on_ray:
        raise ValueError(f"{named} decodes on this machine's GPU: it cannot be used with decode_on='ray'")
    if asked.type == "cuda" and not _installed("nvidia.nvimgcodec"):
        raise ImportError(f"{named} needs nvImageCodec: pip install 'aioloader[gpu]'")


def check_cache(cache: object, decode: object, on_ray: bool) -> Cache | None:
    """``cache``: an :class:`~aioloader.Cache` or None. Its ``max_side`` needs a decode
    made by this machine's CPU workers (they make the small images); a folder must be a
    folder this process can make or write."""
    if cache is None:
        return None
    if not isinstance(cache, Cache):
        raise TypeError(f"cache={cache!r} must be an aioloader.Cache or None")
    if cache.max_side is not None:
        why = (
            "decode=None (no decode workers)"
            if decode is None
            else "decode_on='ray'"
            if on_ray
            else f"{decode!r}, which decodes on the device"
            if decodes_on_device(decode)
            else None
        )
        if why is not None:
            raise ValueError(f"cache={cache!r}: max_side needs decode workers of this machine, not {why}")
    folder = cache.folder
    if folder is not None:
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"cache={cache!r}: {str(folder)!r} is not a folder")
        there = next((p for p in (folder, *folder.parents) if p.exists()), None)
        if there is not None and not os.access(there, os.W_OK | os.X_OK):
            raise ValueError(f"cache={cache!r}: {str(there)!r} is not writable")
    return cache


def with_members(members: SampleMembers, decode: object, cache: object) -> WithMembers:
    """The decode of a tar dataset made with ``from_tars(members=...)``: ``decode`` given each
    sample's dict of members. An ``ImageDecoder`` takes an image's bytes and a cache's
    ``max_side`` shrinks an image file: neither can take a sample of several members."""
    if decode is Decoding.decode or isinstance(decode, ImageDecoder) or decodes_on_device(decode):
        named = f"{decode!r} (the default)" if decode is Decoding.decode else repr(decode)
        raise ValueError(
            f"decode={named} takes an image's bytes, but from_tars(members=...) gives the decode a "
            f"dict of the sample's members: pass a function of your own (it may call {decode!r} on "
            f"sample['jpg'])"
        )
    if isinstance(cache, Cache) and cache.max_side is not None:
        raise ValueError(
            f"cache={cache!r}: max_side shrinks image files, but from_tars(members=...) caches samples "
            f"of several members: leave max_side out"
        )
    return members.around(callable_or_none("decode", decode, "sample dict -> sample"))


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # its parent package is missing
        return False


def decide(reading: Reading, decoding: Decoding, delivery: Delivery, remote: bool) -> Build:
    """What the settings leave to this machine, decided once: the workers (this rank's part
    of the node's CPUs for None and ``"auto"``), where the pipeline starts and the client of
    its remote reads, and the callables pickled for the processes that run them."""
    node = node_ranks(os.environ)
    cpus = cpus_per_rank(usable_cpus(), node)
    given_workers = decoding.num_workers
    workers = given_workers if isinstance(given_workers, int) else cpus
    sent = send_decode(decoding.decode, decoding.on_ray)
    start_in, sent_there = choose_runtime(
        delivery.loader_process,
        decoding.on_ray,
        reading.read,
        delivery.collate,
        reading.storage_backend,
        plain=decoding.decode is None and reading.read is None and not remote,
    )
    return Build(
        start_in=start_in,
        workers=workers,
        cluster_tasks=(given_workers if isinstance(given_workers, int) else None)
        if decoding.on_ray
        else None,
        storage_backend=resolve(reading.storage_backend, start_in == "process"),
        ranks_on_node=node.ranks,
        cpus_per_rank=cpus,
        sent={**sent, **sent_there},
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
