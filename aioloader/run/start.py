"""Which runtime a loader starts: the loop, the decode pool and collate in a loader process
(:class:`~aioloader.run.procruntime.ProcessRuntime`) when ``config.start_in`` is ``"process"``
(settled from ``loader_process="auto"``, the default, or True) and a zygote can be made here,
else in the trainer's process (:class:`~aioloader.run.runtime.Runtime`). Falling back is
silent under ``"auto"`` (a DEBUG line); ``loader_process=True`` warns, saying why."""

from __future__ import annotations

import dataclasses
import logging

from aioloader.config import LoaderConfig
from aioloader.dataset import FileDataset
from aioloader.observe.stats import Counters
from aioloader.run.procruntime import NoZygote, ProcessRuntime
from aioloader.run.runtime import Runtime

__all__ = ["NO_ZYGOTE", "start_runtime"]

logger = logging.getLogger("aioloader")

#: Why a loader that would run in a loader process runs in-process (logged).
NO_ZYGOTE = (
    "no zygote can be made in this process (not POSIX, an unsupported Python, or loader "
    "threads already running); loading in-process"
)


def start_runtime(config: LoaderConfig, dataset: FileDataset, counters: Counters) -> Runtime | ProcessRuntime:
    """The started runtime ``config`` asks for (see the module docstring)."""
    if config.start_in == "process":
        try:
            return ProcessRuntime(config, dataset, counters)
        except NoZygote:
            if config.loader_process == "auto":
                logger.debug("loader_process='auto': %s", NO_ZYGOTE)
            else:
                logger.warning("loader_process=True: %s", NO_ZYGOTE)
            if config.storage_backend == "obstore":  # asked for by name: say it is not used
                logger.warning("storage_backend='obstore' needs a loader process: reading with fsspec")
            # obstore's runtime would outlive close() here (aioloader/read/backends.py)
            config = dataclasses.replace(config, storage_backend="fsspec")
    return Runtime(config, dataset, counters)
