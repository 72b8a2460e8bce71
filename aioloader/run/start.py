"""The device a loader delivers to, settled when it starts (:func:`settle_device`), and which
runtime it starts: the loop, the decode pool and collate in a loader process
(:class:`~aioloader.run.procruntime.ProcessRuntime`) when ``config.start_in`` is ``"process"``
(settled from ``loader_process="auto"``, the default, or True) and a zygote can be made here,
else in the trainer's process (:class:`~aioloader.run.runtime.Runtime`). Falling back is
silent under ``"auto"`` (a DEBUG line); ``loader_process=True`` warns, saying why."""

from __future__ import annotations

import logging
import os

import torch

from aioloader.config import LoaderConfig
from aioloader.dataset import FileDataset
from aioloader.decode.ondevice import device_of
from aioloader.observe.stats import Counters
from aioloader.plan.node import node_ranks, rank_gpu
from aioloader.run.procruntime import NoZygote, ProcessRuntime
from aioloader.run.runtime import Runtime

__all__ = ["NO_ZYGOTE", "settle_device", "start_runtime"]

logger = logging.getLogger("aioloader")

#: Why a loader that would run in a loader process runs in-process (logged).
NO_ZYGOTE = (
    "no zygote can be made in this process (not POSIX, an unsupported Python, or loader "
    "threads already running); loading in-process"
)


def start_runtime(
    config: LoaderConfig, device: torch.device, dataset: FileDataset, counters: Counters
) -> Runtime | ProcessRuntime:
    """The started runtime ``config`` asks for (see the module docstring), delivering on
    ``device`` (settled: :func:`settle_device`)."""
    if config.build.start_in == "process":
        try:
            return ProcessRuntime(config, device, dataset, counters)
        except NoZygote:
            if config.delivery.loader_process == "auto":
                logger.debug("loader_process='auto': %s", NO_ZYGOTE)
            else:
                logger.warning("loader_process=True: %s", NO_ZYGOTE)
            if config.build.storage_backend == "obstore":  # asked for by name: say it is not used
                logger.warning("storage_backend='obstore' needs a loader process: reading with fsspec")
    return Runtime(config, device, dataset, counters)


def settle_device(config: LoaderConfig) -> torch.device:
    """The device a loader of ``config`` delivers on: as given (``"cpu"``, ``"cuda:N"``), else,
    for ``"cuda"``, the index an ``ImageDecoder(device="cuda:N")`` names, else this rank's GPU
    (:func:`aioloader.plan.node.rank_gpu`: the current device if the user set one, else the
    local rank's; a WARNING where two ranks of the node would deliver to one GPU).

    Called on the thread that starts the loader, before any other: CUDA's current device is
    a thread's own. Only an initialised CUDA can have had a device set, so an uninitialised
    one is not initialised here to ask (current device 0)."""
    device = config.delivery.target
    if device.type != "cuda" or device.index is not None:
        return device
    named = device_of(config.decoding.decode)
    if named is not None and torch.device(named).index is not None:
        return torch.device(named)
    current = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    restricted = bool(os.environ.get("CUDA_VISIBLE_DEVICES", "").strip())
    index, warning = rank_gpu(node_ranks(os.environ), torch.cuda.device_count(), current, restricted)
    if warning is not None:
        logger.warning(warning)
    return torch.device("cuda", index)
