"""Which runtime a loader starts: the loop, the decode pool and collate in a loader process
(:class:`~aioloader.run.procruntime.ProcessRuntime`) when ``loader_process`` asks for it and
a zygote can be made here, else in the trainer's process
(:class:`~aioloader.run.runtime.Runtime`), with a warning that says why."""

from __future__ import annotations

import dataclasses
import logging

from aioloader.config import LoaderConfig
from aioloader.dataset import FileDataset
from aioloader.observe.stats import Counters
from aioloader.run.procruntime import NoZygote, ProcessRuntime
from aioloader.run.runtime import Runtime

__all__ = ["start_runtime"]

logger = logging.getLogger("aioloader")


def start_runtime(config: LoaderConfig, dataset: FileDataset, counters: Counters) -> Runtime | ProcessRuntime:
    """The started runtime ``config`` asks for (see the module docstring)."""
    if config.loader_process:
        try:
            return ProcessRuntime(config, dataset, counters)
        except NoZygote:
            logger.warning(
                "loader_process=True: no zygote can be made in this process (not POSIX, an "
                "unsupported Python, or loader threads already running); loading in-process"
            )
            # obstore's runtime would outlive close() here (aioloader/read/backends.py)
            config = dataclasses.replace(config, storage_backend="fsspec")
    return Runtime(config, dataset, counters)
