"""A compact, immutable table of file paths: O(1) look-up, a few dozen bytes per entry.

A 3 TB dataset of ~100 KB files is ~30 M paths. As a ``list[str]`` each path is a ``str``
object, its text and the list slot: gigabytes before any label (RESULTS §0f). Here paths
are split into their folder and their file name: folders are few (one per class, say) and
stored once; the names are one UTF-8 byte buffer with an ``int64`` offset per entry, and
each entry keeps an ``int32`` folder number. An entry costs ``len(name) + 12`` bytes.

Building is streaming (:class:`PathTableBuilder`): rows are appended one at a time, so a
30 M-row CSV never exists as a list of strings in memory.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

__all__ = ["PathTable", "PathTableBuilder"]

_SEP = os.sep


class PathTable(Sequence[str]):
    """``table[i]`` is the ``i``-th path as a ``str``; immutable; O(1) per look-up."""

    def __init__(
        self,
        folders: list[str],
        folder_ids: npt.NDArray[np.int32],
        names: npt.NDArray[np.uint8],
        offsets: npt.NDArray[np.integer[Any]],
    ) -> None:
        self._folders = folders
        self._folder_ids = folder_ids
        self._names = names
        self._offsets = offsets  # len + 1 entries: name i is names[offsets[i]:offsets[i + 1]]

    def __len__(self) -> int:
        return len(self._folder_ids)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"path index {index} out of range for {n} paths")
        raw = self._names[self._offsets[i] : self._offsets[i + 1]].tobytes()
        name = raw.decode("utf-8", "surrogateescape")
        folder = self._folders[self._folder_ids[i]]
        return folder + name if folder else name

    def many(self, indices: Sequence[int]) -> list[str]:
        """The paths of ``indices``, in one pass: the offsets and folders of all of them
        looked up at once, each name decoded straight from the buffer (a batch's paths for
        a fraction of what one look-up each costs)."""
        n = len(self)
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            return []
        if idx.min() < -n or idx.max() >= n:
            bad = next(int(i) for i in idx if not -n <= i < n)
            raise IndexError(f"path index {bad} out of range for {n} paths")
        idx = np.where(idx < 0, idx + n, idx)
        starts = self._offsets[idx].tolist()
        ends = self._offsets[idx + 1].tolist()
        folders = self._folders
        names = self._names.data  # a memoryview: names decoded from it, not copied first
        return [
            folders[f] + str(names[a:b], "utf-8", "surrogateescape")
            for a, b, f in zip(starts, ends, self._folder_ids[idx].tolist(), strict=True)
        ]

    def __iter__(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(p) for p in self[:3])
        return f"PathTable([{head}{', ...' if len(self) > 3 else ''}], {len(self)} paths)"

    @property
    def nbytes(self) -> int:
        """Bytes held by the table's arrays and folder strings (not counting this object)."""
        folders = sum(len(f.encode("utf-8", "surrogateescape")) + 49 for f in self._folders)
        return self._names.nbytes + self._offsets.nbytes + self._folder_ids.nbytes + folders


class PathTableBuilder:
    """Appends paths one at a time, then :meth:`build` freezes them into a :class:`PathTable`."""

    def __init__(self) -> None:
        self._folder_index: dict[str, int] = {}
        self._folders: list[str] = []
        self._folder_ids = array("i")
        self._names = bytearray()
        self._offsets = array("q", [0])
        self._last_folder: tuple[str, int] | None = None

    def __len__(self) -> int:
        return len(self._folder_ids)

    def append(self, path: str) -> None:
        cut = path.rfind(_SEP) + 1
        folder, name = path[:cut], path[cut:]
        last = self._last_folder
        if last is not None and last[0] == folder:  # consecutive rows share a folder: skip the dict
            fid = last[1]
        else:
            got = self._folder_index.get(folder)
            if got is None:
                got = len(self._folders)
                self._folder_index[folder] = got
                self._folders.append(folder)
            fid = got
            self._last_folder = (folder, fid)
        self._folder_ids.append(fid)
        self._names += name.encode("utf-8", "surrogateescape")
        self._offsets.append(len(self._names))

    def build(self) -> PathTable:
        """The table. The builder's buffers are handed over without a copy (so the peak
        memory of a build stays one table); the builder must not be used afterwards."""
        ids = np.frombuffer(self._folder_ids, dtype=np.int32) if len(self) else np.zeros(0, np.int32)
        names = np.frombuffer(self._names, dtype=np.uint8) if self._names else np.zeros(0, np.uint8)
        offsets: npt.NDArray[np.integer[Any]] = np.frombuffer(self._offsets, dtype=np.int64)
        if offsets[-1] < 2**32:  # names under 4 GiB (30 M names of 100 bytes): 4 bytes an entry
            offsets = offsets.astype(np.uint32)
        self._offsets = array("q")  # let the int64 copy go now
        return PathTable(self._folders, ids, names, offsets)
