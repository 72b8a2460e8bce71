"""The rows of a dataset's index checked one by one, as ``FileDataset``'s constructors read
them (a list, a CSV file, a DataFrame): byte-range entries, integers in text, label columns
(numbers, or class names mapped to the indices of their sorted order), column names,
relative paths. Pure: each error names the row or column and shows the value.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from aioloader.read.urls import scheme

__all__ = [
    "LabelCodes",
    "as_int",
    "check_columns",
    "span_entry",
    "labels_to_indices",
    "resolve",
    "span_columns",
]


def labels_to_indices(raw: Sequence[Any], where: str) -> tuple[npt.NDArray[np.int64], list[str] | None]:
    """Integer labels pass through; anything else maps to indices of its sorted classes."""
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in raw):
        return np.asarray(raw, dtype=np.int64), None
    if any(
        v is None or (isinstance(v, float) and v != v) or (isinstance(v, str) and not v.strip()) for v in raw
    ):
        raise ValueError(f"{where}: some labels are missing (empty or NaN)")
    names = [str(v) for v in raw]
    classes = sorted(set(names))
    lookup = {c: i for i, c in enumerate(classes)}
    return np.asarray([lookup[v] for v in names], dtype=np.int64), classes


def span_entry(entry: tuple[Any, ...], where: str = "") -> tuple[str, int, int]:
    """A ``(path, offset, length)`` entry, checked (``where``: the row, for the message)."""
    at = f"{where}: " if where else ""
    if len(entry) != 3 or not isinstance(entry[0], (str, os.PathLike)):
        raise TypeError(f"{at}a ranged entry is (path, offset, length), got {entry!r}")
    path, offset, length = entry
    for name, value in (("offset", offset), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{at}{name}={value!r} of {os.fspath(path)!r} must be a non-negative integer")
    if length == 0:
        raise ValueError(f"{at}length=0 of {os.fspath(path)!r}: a sample needs at least one byte")
    return os.fspath(path), int(offset), int(length)


def as_int(value: Any) -> Any:
    """A CSV field (or a pandas cell) that holds an integer, as one; anything else as it
    is, for :func:`span_entry` to refuse with its value shown."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def span_columns(offset_column: str | None, length_column: str | None, where: str) -> bool:
    """Whether rows are byte ranges: both columns or neither."""
    if (offset_column is None) != (length_column is None):
        raise ValueError(
            f"{where}: offset_column={offset_column!r} and length_column={length_column!r} go together"
        )
    return offset_column is not None


def resolve(path: str, base: str | None) -> str:
    """``path`` joined to ``base`` when it is relative (and tidied: ``a/./b`` -> ``a/b``).
    A URL (``s3://...``) is never relative; under a URL ``base``, ``path`` joins with ``/``."""
    if base is None or os.path.isabs(path) or scheme(path) is not None:
        return path
    if scheme(base) is not None:
        return base.rstrip("/") + "/" + path.lstrip("/")
    return os.path.normpath(os.path.join(base, path))


class LabelCodes:
    """CSV label column, streamed: each distinct text gets a code as it first appears; at the
    end, texts that are all integers ("3") are those integers, anything else class names
    whose sorted order gives the labels."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.index: dict[str, int] = {}
        self.codes = array("q")

    def add(self, text: str) -> None:
        code = self.index.get(text)
        if code is None:
            if not text.strip():
                raise ValueError(f"{self.where}: some labels are missing (empty)")
            code = self.index[text] = len(self.index)
        self.codes.append(code)

    def finish(self) -> tuple[npt.NDArray[np.int64], list[str] | None]:
        texts = list(self.index)
        codes = np.frombuffer(self.codes, dtype=np.int64)
        if all(t.strip().lstrip("-").isdigit() for t in texts):
            return np.asarray([int(t) for t in texts], dtype=np.int64)[codes], None
        classes = sorted(texts)
        rank = {c: i for i, c in enumerate(classes)}
        return np.asarray([rank[t] for t in texts], dtype=np.int64)[codes], classes


def check_columns(header: Sequence[str], wanted: Sequence[str | None], where: str) -> None:
    for col in wanted:
        if col is not None and col not in header:
            raise ValueError(f"{where}: column {col!r} not found; columns are {list(header)}")
