"""aioloader: keep the accelerator fed.

Files are read concurrently on an asyncio event loop, decoded in worker processes, collated
into batches held in a bounded queue and copied to the device by a bridging thread, so a
training step costs ``max(T_load, T_train)`` instead of their sum. See ``Loader``.

The names that need torch (``Loader``, ``default_collate``) are imported on first use: the
decode workers import this package to run ``ImageDecoder`` and ``sample_rng``, and without
torch they start in a fraction of the time and memory.

The subpackages are the data flow's wings (``read/``, ``decode/``, ``engine/``, ``run/``, ...),
each importing only those below it; each wing's ``__init__`` maps its modules, and the
documentation's ``docs/how-it-works/layout.md`` draws the whole house.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aioloader.cache.settings import Cache
from aioloader.dataset import IMAGE_EXTENSIONS, FileDataset
from aioloader.decode.image import ImageDecoder
from aioloader.decode.worker import sample_rng
from aioloader.errors import (
    CollateError,
    DecodeError,
    LoaderClosedError,
    LoaderError,
    LoaderTimeoutError,
    ReadError,
    SampleError,
    WorkerCrashedError,
)
from aioloader.observe.bottleneck import Bottleneck
from aioloader.observe.cachestats import CacheStats
from aioloader.observe.stages import StageStats
from aioloader.observe.stats import LoaderStats
from aioloader.plan.locality import Locality

if TYPE_CHECKING:
    from aioloader.collate import default_collate
    from aioloader.loader import Loader

__version__ = "0.1.0"

__all__ = [
    "IMAGE_EXTENSIONS",
    "Bottleneck",
    "Cache",
    "CacheStats",
    "CollateError",
    "DecodeError",
    "FileDataset",
    "ImageDecoder",
    "Loader",
    "LoaderClosedError",
    "LoaderError",
    "LoaderStats",
    "LoaderTimeoutError",
    "Locality",
    "ReadError",
    "SampleError",
    "StageStats",
    "WorkerCrashedError",
    "__version__",
    "default_collate",
    "sample_rng",
]

_LAZY = {"Loader": ".loader", "default_collate": ".collate"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'aioloader' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
