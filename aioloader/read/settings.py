"""The reading part's settings: how many reads are in flight, what reads a file, how often a
read is tried again, and the client and options of remote reads.

:class:`Reading` holds ``Loader``'s ``io_concurrency``, ``read``, ``read_retries``,
``storage_options`` and ``storage_backend``: their defaults are here (``Loader``'s signature
reads them), and each is checked when a ``Reading`` is made, the error naming the argument
and showing the value (``storage_options`` by its type only: it may hold credentials).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from aioloader.base.checks import callable_or_none, non_negative_int, positive_int
from aioloader.read.backends import StorageBackend

__all__ = ["AUTO_IO_START", "Reading"]

#: Reads in flight an ``io_concurrency="auto"`` loader starts with (:mod:`aioloader.tune.rules` moves it).
AUTO_IO_START = 64


@dataclass(frozen=True)
class Reading:
    """How the files are read (see ``Loader`` for each setting)."""

    io_concurrency: int | Literal["auto"] = "auto"
    read: Callable[[str], bytes] | None = None
    read_retries: int = 2
    #: fsspec options for remote URLs; never shown (credentials).
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    storage_backend: StorageBackend = "auto"

    def __post_init__(self) -> None:
        if self.io_concurrency != "auto":
            if isinstance(self.io_concurrency, str):
                raise ValueError(
                    f"io_concurrency={self.io_concurrency!r} must be a positive integer or 'auto'"
                )
            positive_int("io_concurrency", self.io_concurrency)
        callable_or_none("read", self.read, "path -> bytes")
        non_negative_int("read_retries", self.read_retries)
        if self.storage_options is not None:
            if not isinstance(self.storage_options, Mapping):
                raise TypeError(
                    f"storage_options must be a dict (fsspec's options, or one per protocol), "
                    f"got {type(self.storage_options).__name__}"
                )
            object.__setattr__(self, "storage_options", dict(self.storage_options))  # a copy, kept
        if self.storage_backend not in ("auto", "fsspec", "obstore"):
            raise ValueError(
                f"storage_backend={self.storage_backend!r} must be 'auto', 'fsspec' or 'obstore'"
            )

    @property
    def io_auto(self) -> bool:
        """``io_concurrency="auto"``: the tuner moves the reads in flight."""
        return self.io_concurrency == "auto"

    @property
    def io_start(self) -> int:
        """The reads in flight the loader starts with: as given, or :data:`AUTO_IO_START`."""
        return AUTO_IO_START if self.io_concurrency == "auto" else self.io_concurrency
