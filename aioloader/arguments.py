"""A loader's arguments as given, and the check of each: plain functions, no policy.

:class:`Arguments` holds what ``Loader(...)`` was given, unchecked. Each ``check_*`` function
below takes one argument (or the few that only mean something together), returns the value
the settings keep, or raises ``ValueError``/``TypeError`` naming the argument and showing the
value, e.g. ``batch_size=0 must be a positive integer``.
:meth:`~aioloader.config.LoaderConfig.create` runs them, then settles the policies (where the
pipeline runs, which callables are pickled) in :mod:`aioloader.config`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch

from aioloader.cache.settings import Cache
from aioloader.decode.ondevice import decodes_on_device, device_of

__all__ = [
    "check_cache",
    "check_device_decode",
    "FLAGS",
    "Arguments",
    "DecodeOn",
    "LoaderProcess",
    "OnError",
    "Progress",
    "check_callables",
    "check_decode_on",
    "check_device",
    "check_failures",
    "check_flags",
    "check_io_concurrency",
    "check_loader_process",
    "check_num_workers",
    "check_progress",
    "check_sample_timeout",
    "check_storage_options",
    "non_negative_int",
    "positive_int",
    "resolve_device",
    "resolve_rank",
]

#: ``on_error``: what a failed sample does.
OnError = Literal["raise", "skip"]
#: ``decode_on``: where the decode runs.
DecodeOn = Literal["local", "ray"]
#: ``loader_process``: ``"auto"`` (a loader process wherever one can be made), True or False.
LoaderProcess = bool | Literal["auto"]
#: ``progress``: a bar when stderr is a terminal (True), always, or never.
Progress = bool | Literal["always"]


@dataclass(frozen=True)
class Arguments:
    """What ``Loader(...)`` was given, by the same names, before any check (``Loader``'s
    defaults, but for ``decode``, which the loader settles first)."""

    batch_size: object
    decode: object
    collate: object
    shuffle: object
    seed: object
    drop_last: object
    num_workers: object
    io_concurrency: object
    prefetch: object
    ordered: object
    device: object
    pin_memory: object
    on_error: object
    max_failures: object
    read: object = None
    zero_copy: object = True
    read_retries: object = 2
    sample_timeout: object = None
    max_worker_restarts: object = 3
    rank: object = None
    world_size: object = None
    pad_shards: object = True
    loader_process: object = "auto"
    storage_options: object = None
    storage_backend: object = "auto"
    progress: object = False
    decode_on: object = "local"
    cache: object = None


#: The arguments that are True or False, in the order they are checked.
FLAGS = ("shuffle", "drop_last", "ordered", "zero_copy", "pad_shards")


def positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return value


def non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be a non-negative integer")
    return value


def check_callables(
    decode: object, read: object, collate: object
) -> tuple[Callable[[bytes], Any] | None, Callable[[str], bytes] | None, Callable[[list[Any]], Any] | None]:
    """``(decode, read, collate)``, each a callable or None."""
    if decode is not None and not callable(decode):
        raise TypeError(f"decode={decode!r} must be callable (bytes -> sample) or None")
    if read is not None and not callable(read):
        raise TypeError(f"read={read!r} must be callable (path -> bytes) or None")
    if collate is not None and not callable(collate):
        raise TypeError(f"collate={collate!r} must be callable (list of samples -> batch)")
    return (
        cast("Callable[[bytes], Any] | None", decode),
        cast("Callable[[str], bytes] | None", read),
        cast("Callable[[list[Any]], Any] | None", collate),
    )


def check_flags(args: Arguments) -> None:
    """Each of :data:`FLAGS` True or False (nothing else that is true or false)."""
    for name in FLAGS:
        flag = getattr(args, name)
        if not isinstance(flag, bool):
            raise TypeError(f"{name}={flag!r} must be True or False")


def check_loader_process(value: object) -> LoaderProcess:
    if not (isinstance(value, bool) or value == "auto"):
        raise ValueError(f"loader_process={value!r} must be 'auto', True or False")
    return value


def check_decode_on(decode_on: object, decode: object, num_workers: object, loader_process: object) -> bool:
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


def check_num_workers(value: object, usable_cpus: Callable[[], int]) -> tuple[int, bool]:
    """``(processes, "auto")``: None and ``"auto"`` start ``usable_cpus()`` (called only
    then: the CPUs this rank may use), ``"auto"`` letting the tuner pick how many decode."""
    auto = value == "auto"
    if value is None or auto:
        return usable_cpus(), auto
    if isinstance(value, str):
        raise ValueError(f"num_workers={value!r} must be a positive integer, 'auto' or None")
    return positive_int("num_workers", value), False


def check_io_concurrency(value: object, auto_start: int) -> tuple[int, bool]:
    """``(reads in flight, "auto")``: ``"auto"`` starts at ``auto_start``."""
    if value == "auto":
        return auto_start, True
    if isinstance(value, str):
        raise ValueError(f"io_concurrency={value!r} must be a positive integer or 'auto'")
    return positive_int("io_concurrency", value), False


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device batches are delivered on; refuses CUDA when this machine has none, and an
    index it has not. ``"cuda"`` keeps no index: the loader settles it when it starts, as this
    rank's GPU (:func:`aioloader.run.start.settle_device`), not as the current device now."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a valid torch device") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} needs CUDA, but torch.cuda.is_available() is False")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return dev
    if dev.type != "cpu":
        raise ValueError(f"device={device!r}: only 'cpu' and 'cuda[:N]' are supported")
    return dev


def check_device(device: object, pin_memory: object) -> tuple[torch.device, bool]:
    """``(device, pin_memory)``: copying from page-locked memory only means something for a
    CUDA copy; elsewhere it is ignored (False)."""
    if not (device is None or isinstance(device, (str, torch.device))):
        raise TypeError(f"device={device!r} must be None, a string or a torch.device")
    dev = resolve_device(device)
    if pin_memory is not None and not isinstance(pin_memory, bool):
        raise TypeError(f"pin_memory={pin_memory!r} must be True, False or None")
    return dev, dev.type == "cuda" and bool(pin_memory is None or pin_memory)


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


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # its parent package is missing
        return False


def check_failures(on_error: object, max_failures: object) -> tuple[OnError, int | float | None]:
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
    return on_error, max_failures


def check_sample_timeout(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"sample_timeout={value!r} must be a positive number of seconds or None")
    return float(value)


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
    ws = positive_int("world_size", world_size)
    r = non_negative_int("rank", rank)
    if r >= ws:
        raise ValueError(f"rank={r} must be below world_size={ws}")
    return r, ws


def check_storage_options(value: object) -> dict[str, Any] | None:
    """A copy of the options (fsspec's, or one dict per protocol); never shown: a wrong type
    is named by its type alone, since the value may hold credentials."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(
            f"storage_options must be a dict (fsspec's options, or one per protocol), "
            f"got {type(value).__name__}"
        )
    return dict(value)


def check_progress(value: object) -> Progress:
    if value not in (True, False, "always") or not isinstance(value, (bool, str)):
        raise ValueError(f"progress={value!r} must be True, False or 'always'")
    return value
