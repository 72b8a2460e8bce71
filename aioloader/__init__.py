"""aioloader: keep the accelerator fed.

Files are read concurrently on an asyncio event loop, decoded in worker processes, collated
into batches held in a bounded queue and copied to the device by a bridging thread, so a
training step costs ``max(T_load, T_train)`` instead of their sum. See ``Loader``.
"""

from __future__ import annotations

from ._worker import sample_rng
from .collate import default_collate
from .dataset import IMAGE_EXTENSIONS, FileDataset
from .decode import ImageDecoder
from .errors import (
    DecodeError,
    LoaderClosedError,
    LoaderError,
    LoaderTimeoutError,
    ReadError,
    SampleError,
    WorkerCrashedError,
)
from .loader import Loader
from .stats import LoaderStats

__version__ = "0.1.0"

__all__ = [
    "IMAGE_EXTENSIONS",
    "DecodeError",
    "FileDataset",
    "ImageDecoder",
    "Loader",
    "LoaderClosedError",
    "LoaderError",
    "LoaderStats",
    "LoaderTimeoutError",
    "ReadError",
    "SampleError",
    "WorkerCrashedError",
    "__version__",
    "default_collate",
    "sample_rng",
]
