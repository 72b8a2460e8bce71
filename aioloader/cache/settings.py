"""``aioloader.Cache``: what a loader's sample cache keeps and where (DESIGN.md, "Sample
cache"). Settings only: checked when made, with no I/O; the bound a loader actually uses
is settled when its pipeline starts (:func:`resolved_bound`), where the memory and the disk
are."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FORMAT", "Cache", "resolved_bound"]

#: The entry format's version: part of every key, so a later format never reads an older one.
FORMAT = 1


def _positive(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"Cache({name}={value!r}): must be a positive integer or None")
    return value


@dataclass(frozen=True)
class Cache:
    """A sample cache for a :class:`~aioloader.Loader` (``Loader(..., cache=Cache(...))``).

    What is cached is the bytes each sample's ``decode`` receives: the first epoch fills it
    as it reads each file, later epochs read the cache instead of the source. Any ``decode``
    works unchanged.

    Args:
        directory: None (default): in the loader's memory, counted once however many
            processes read it, gone with the loader. A folder: entries are files there, on
            local disk, reused by later runs and shared by the ranks of one node (each entry
            written to a temporary name, then renamed: one copy, never half of one).
        max_bytes: the bound, in bytes of entries held. Default: a quarter of the memory
            available when the loader starts (in memory), half the free space of the
            folder's filesystem (on disk). At the bound, later samples are read from the
            source: nothing is evicted.
        max_side: None (default): the file's bytes as they are. ``N``: image files (JPEG,
            PNG, WebP, BMP, TIFF) are kept re-encoded as JPEG, EXIF orientation applied,
            their longer side at most ``N`` pixels (never enlarged), made by the decode
            workers as the first epoch reads each file: ``decode`` receives the small image
            from the first epoch on, also for samples past the bound (a large photo is
            decoded once, at a reduced scale). Needs this machine's CPU workers: refused
            with ``decode=None``, ``decode_on="ray"`` and ``ImageDecoder(device=...)``.
            This changes what the model sees (as FFCV's ``max_resolution`` does), so it is
            opt-in. Other files are kept as they are.
        quality: the JPEG quality of those re-encoded images (1-100).

    An entry is keyed by the source's identity (absolute path or URL, size, modification
    time or ETag) and by these settings: a file is stat'ed every epoch, an object asked for
    once per run (:mod:`aioloader.cache.identity`); a changed source is read again; an
    entry cut short (a killed trainer, a full disk) is found by its length and checksum and
    read again. A cache that fails loses entries, never samples.
    """

    directory: str | os.PathLike[str] | None = None
    max_bytes: int | None = None
    max_side: int | None = None
    quality: int = 90

    def __post_init__(self) -> None:
        if self.directory is not None and not isinstance(self.directory, (str, os.PathLike)):
            raise TypeError(f"Cache(directory={self.directory!r}): must be a path or None")
        if self.directory is not None and not os.fspath(self.directory):
            raise ValueError("Cache(directory=''): must be a folder's path, or None for memory")
        _positive("max_bytes", self.max_bytes)
        _positive("max_side", self.max_side)
        q = self.quality
        if isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= 100:
            raise ValueError(f"Cache(quality={q!r}): must be an integer from 1 to 100")

    @property
    def folder(self) -> Path | None:
        """The folder of a disk cache (user and variables expanded), None in memory."""
        if self.directory is None:
            return None
        return Path(os.path.expandvars(os.fspath(self.directory))).expanduser()

    @property
    def fingerprint(self) -> str:
        """What the settings make of a file's bytes, as it enters every key: two caches
        with the same fingerprint keep the same bytes for the same source."""
        made = "as-is" if self.max_side is None else f"jpeg{self.quality}-side{self.max_side}"
        return f"v{FORMAT}:{made}"


def resolved_bound(cache: Cache, available: int | None) -> int:
    """The bound in bytes ``cache`` keeps to: ``max_bytes``, else a quarter of
    ``available`` memory (1 GiB where unknown) in memory, or half the free space of its
    folder (made if missing) on disk."""
    if cache.max_bytes is not None:
        return cache.max_bytes
    folder = cache.folder
    if folder is None:
        return (1 << 30) if available is None else max(1, available // 4)
    folder.mkdir(parents=True, exist_ok=True)
    return max(1, shutil.disk_usage(folder).free // 2)
