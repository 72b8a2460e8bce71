"""``FileDataset``: the list of files to load, with optional integer labels.

Built from a list of paths, an ImageFolder-style tree, a CSV file or a pandas DataFrame.
Everything that can be wrong with the listing (no files, a missing column, a missing root)
fails here, at construction, with a message naming what is missing; a file that vanishes
later fails at read time as a ``ReadError``.
"""

from __future__ import annotations

import csv
import os
from array import array
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from aioloader.entries import (
    LabelCodes,
    as_int,
    check_columns,
    labels_to_indices,
    resolve,
    span_columns,
    span_entry,
)
from aioloader.pathtable import PathTableBuilder
from aioloader.read.remote import list_folder
from aioloader.read.tarindex import sample_table
from aioloader.read.tars import expand_shards
from aioloader.read.tarsample import MemberNames, SampleMembers, extra_members
from aioloader.read.urls import is_remote, local_path, redact

__all__ = ["IMAGE_EXTENSIONS", "FileDataset"]

#: Extensions ``from_folder`` keeps by default (compared lower-case).
IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif"}
)

StrPath = str | os.PathLike[str]


class FileDataset:
    """An ordered list of file paths, with optional integer labels.

    ``dataset[i]`` is ``(path, label)`` (or ``(path, None)`` without labels); ``len`` is the
    number of files. ``classes``/``class_to_idx`` are set when labels came from names
    (folders or string labels).

    Paths live in a compact :class:`~aioloader.pathtable.PathTable` (about ``len(file
    name) + 8`` bytes each) and labels in one ``int64`` array, so 30 M files fit in well
    under 2 GB and every look-up is O(1); see ``benchmarks/index_scale.py``.

    A path may be a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``), and
    an entry may be ``(path, offset, length)``: the sample is those bytes of the file or
    object (samples inside a tar or concatenated shard, read without unpacking it; 16 more
    bytes per entry, see :meth:`span`).
    """

    #: What a tar dataset's decode is given besides the image (``from_tars(members=...)``).
    members: SampleMembers | None = None
    _names: MemberNames | None = None

    def __init__(
        self,
        paths: Iterable[StrPath | tuple[StrPath, int, int]],
        labels: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
        *,
        root: StrPath | None = None,
        classes: Sequence[str] | None = None,
    ) -> None:
        base = os.fspath(root) if root is not None else None
        builder = PathTableBuilder()
        spans = array("q")  # offset, length per entry; -1, -1 for a whole file
        ranged = False
        for p in paths:
            if isinstance(p, tuple):
                path, offset, length = span_entry(p)
                ranged = True
            elif isinstance(p, (str, os.PathLike)):
                path, offset, length = os.fspath(p), -1, -1
            else:
                raise TypeError(
                    f"paths must be str, os.PathLike or (path, offset, length), got {type(p).__name__}: {p!r}"
                )
            builder.append(resolve(path, base))
            spans.extend((offset, length))
        if not len(builder):
            raise ValueError("FileDataset is empty: no paths were given")
        self._paths = builder.build()
        #: ``(offset, length)`` in bytes per entry (-1 for a whole file), or None: all whole.
        self._spans = np.frombuffer(spans, dtype=np.int64).reshape(-1, 2) if ranged else None
        self._runs: npt.NDArray[np.int64] | None = None
        self._labels: npt.NDArray[np.int64] | None = None
        if labels is not None:
            arr = np.asarray(labels)
            if arr.ndim != 1 or len(arr) != len(self._paths):
                raise ValueError(f"labels has {arr.size} entries but there are {len(self._paths)} paths")
            if not np.issubdtype(arr.dtype, np.integer):
                raise TypeError(f"labels must be integers, got dtype {arr.dtype}")
            self._labels = arr.astype(np.int64)
        self.classes: list[str] | None = list(classes) if classes is not None else None

    @property
    def class_to_idx(self) -> dict[str, int] | None:
        """``{class name: label}``, or None when labels did not come from names."""
        return None if self.classes is None else {c: i for i, c in enumerate(self.classes)}

    @property
    def has_labels(self) -> bool:
        return self._labels is not None

    @property
    def paths(self) -> Sequence[str]:
        return self._paths

    @property
    def labels(self) -> npt.NDArray[np.int64] | None:
        return self._labels

    def path(self, index: int) -> str:
        return self._paths[int(index)]

    def paths_of(self, indices: Sequence[int]) -> list[str]:
        """The paths of ``indices`` (a batch's), looked up together."""
        return self._paths.many(indices)

    @property
    def has_spans(self) -> bool:
        """Whether some entry is a ``(path, offset, length)`` span."""
        return self._spans is not None

    def span(self, index: int) -> tuple[int, int] | None:
        """``(offset, length)`` of entry ``index``'s bytes inside its file or object (a
        sample inside a tar or concatenated shard), or None for the whole file."""
        if self._spans is None:
            return None
        offset, length = (int(x) for x in self._spans[int(index)])
        return None if offset < 0 else (offset, length)

    def runs(self) -> npt.NDArray[np.int64]:
        """The start index of each run of consecutive entries in one file (a tar shard's
        samples), ascending from 0: the shards of ``Loader(locality=...)``'s order. Computed
        once: O(n) string comparisons, or the shards' starts ``from_tars`` found."""
        runs: npt.NDArray[np.int64] | None = getattr(self, "_runs", None)  # None in an old pickle too
        if runs is None:
            paths, names = self._paths, self._names
            starts = (
                names.starts
                if names
                else [i for i in range(len(paths)) if i == 0 or paths[i] != paths[i - 1]]
            )
            runs = self._runs = np.asarray(starts, dtype=np.int64)
        return runs

    def member(self, index: int) -> str | None:
        """The tar member sample ``index`` is (its image's name), None outside a tar."""
        return self._names.name(index) if self._names is not None else None

    def label(self, index: int) -> int | None:
        return None if self._labels is None else int(self._labels[index])

    def __len__(self) -> int:
        return len(self._paths)

    def __getitem__(self, index: int) -> tuple[str, int | None]:
        return self._paths[int(index)], self.label(index)

    def __repr__(self) -> str:
        extra = f", classes={len(self.classes)}" if self.classes is not None else ""
        return f"FileDataset({len(self)} files{extra})"

    @classmethod
    def coerce(cls, dataset: object) -> FileDataset:
        """``dataset`` as given to a loader: a :class:`FileDataset` as it is, a sequence of
        paths as one without labels; a ``TypeError`` for anything else."""
        if isinstance(dataset, FileDataset):
            return dataset
        if isinstance(dataset, (str, bytes)) or not isinstance(dataset, Sequence):
            got = type(dataset).__name__
            raise TypeError(f"dataset must be a FileDataset or a sequence of paths, got {got}")
        return cls(dataset)

    @classmethod
    def from_folder(
        cls,
        root: StrPath,
        *,
        extensions: Iterable[str] | None = IMAGE_EXTENSIONS,
        storage_options: Mapping[str, Any] | None = None,
    ) -> FileDataset:
        """ImageFolder layout: ``root/<class>/**/<file>``; sorted class folders get labels
        0..K-1. Hidden files and folders (``.name``) are skipped; ``extensions`` filters
        files by suffix (case-insensitive; None keeps every file). Files are sorted, so the
        order does not depend on the file system. A class folder with no such file is a
        ``ValueError`` naming it, as in torchvision's ImageFolder.

        ``root`` may be a prefix in object storage (``s3://bucket/train/``, ``gs://``,
        ``az://``): the class prefixes are then listed concurrently, with
        ``storage_options`` (as for :class:`~aioloader.Loader`)."""
        exts = (
            None
            if extensions is None
            else {e.lower() if e.startswith(".") else "." + e.lower() for e in extensions}
        )
        if isinstance(root, str) and is_remote(root):
            where = redact(root)
            listed = list_folder(root, storage_options)
            if not listed:
                raise ValueError(f"from_folder: {where!r} has no class prefixes")
        else:
            top = Path(local_path(os.fspath(root)))
            where = os.fspath(top)
            if not top.is_dir():
                raise FileNotFoundError(f"from_folder: root folder {_not_there(top)}")
            names = sorted(d.name for d in top.iterdir() if d.is_dir() and not d.name.startswith("."))
            if not names:
                raise ValueError(f"from_folder: {where!r} has no class sub-folders")
            listed = {name: _walk(top / name) for name in names}
        classes = sorted(listed)
        paths: list[str] = []
        labels: list[int] = []
        empty: list[str] = []
        for label, name in enumerate(classes):
            found = [p for p in listed[name] if exts is None or os.path.splitext(p)[1].lower() in exts]
            paths.extend(found)
            labels.extend([label] * len(found))
            if not found:
                empty.append(name)
        if not paths:
            raise ValueError(f"from_folder: no files with extensions {sorted(exts or [])} under {where!r}")
        if empty:
            # As torchvision's ImageFolder: a class with no file is most often a copy cut
            # short or the wrong extensions, and its label would silently never occur.
            folders = ", ".join(repr(_join(where, name)) for name in empty[:5]) + (
                ", ..." if len(empty) > 5 else ""
            )
            kind = "files" if exts is None else f"files with extensions {sorted(exts)}"
            raise ValueError(
                f"from_folder: {len(empty)} class folder(s) under {where!r} hold no {kind}: {folders}; "
                "remove them or put files in them (extensions= chooses which files count)"
            )
        return cls(paths, labels, classes=classes)

    @classmethod
    def from_tars(
        cls,
        shards: StrPath | Sequence[StrPath],
        *,
        image: str | None = None,
        label: str | tuple[str, str] | None = "cls",
        members: str | Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> FileDataset:
        """Samples in tar shards, WebDataset's layout: a sample is the run of members sharing
        a key (``abc.jpg``, ``abc.cls``). ``decode`` receives its image member's bytes
        (``image``: that extension; default the first of ``jpg``, ``jpeg``, ``png``, ...); with
        ``members`` (extensions, such as ``("json",)``, or ``"all"``) webdataset's dict instead:
        ``{"__key__": key, "jpg": bytes, "json": bytes}``. ``label``: ``"cls"`` (an int as text),
        ``("json", "field")`` or None. ``shards``: paths or URLs, a local glob or brace notation
        (``s3://b/train-{000000..001023}.tar``); ``storage_options`` as ``Loader``'s. Each shard
        is indexed once (a sidecar ``<shard>.idx``, the index cache, or a scan:
        :mod:`aioloader.read.tarscan`). A shard missing, not a tar or cut short, a sample
        without its image, label or a ``members`` member: errors naming the shard and the key,
        here; a shard changed or gone later: a :class:`~aioloader.ReadError` naming it and the
        member, at read time. See the guide, *Tar shards*."""
        extra = extra_members(members)
        urls = expand_shards(shards)
        entries, labels, names = sample_table(urls, storage_options, image, label, extra)
        if not entries:
            raise ValueError(f"from_tars: no samples in {len(urls)} shard(s) ({redact(urls[0])}, ...)")
        dataset = cls(entries, labels if label is not None else None)
        dataset._names = names
        dataset.members = SampleMembers(image, extra) if extra != () else None
        return dataset

    @classmethod
    def from_csv(
        cls,
        path: StrPath,
        *,
        path_column: str = "path",
        label_column: str | None = None,
        root: StrPath | None = None,
        offset_column: str | None = None,
        length_column: str | None = None,
    ) -> FileDataset:
        """Rows of a CSV file with a header. Relative paths resolve against ``root``, or
        else the CSV file's folder (URLs stay as they are). String labels map to indices of
        their sorted names. With ``offset_column`` and ``length_column`` each row is the
        byte range ``(path, offset, length)`` of its file or object (see :meth:`span`)."""
        csv_path = Path(path)
        if not csv_path.is_file():
            raise FileNotFoundError(f"from_csv: CSV file {_not_there(Path(csv_path))}")
        where = f"from_csv({os.fspath(csv_path)!r})"
        base = os.fspath(root if root is not None else csv_path.parent)
        builder = PathTableBuilder()
        codes = LabelCodes(where) if label_column is not None else None
        ranged = span_columns(offset_column, length_column, where)
        spans = array("q")
        # Streamed row by row: a CSV of 30 M rows never becomes a list of 30 M strings.
        with open(csv_path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            check_columns(header, (path_column, label_column, offset_column, length_column), where)
            pcol, lcol, ocol, ncol = (
                header.index(c) if c is not None else -1
                for c in (path_column, label_column, offset_column, length_column)
            )
            for line, row in enumerate(reader, start=2):
                if not row:
                    continue  # a blank line
                if len(row) <= max(pcol, lcol, ocol, ncol):
                    raise ValueError(
                        f"{where}: line {line} is missing fields: it has {len(row)}, the header {len(header)}"
                    )
                entry = resolve(row[pcol], base)
                if ranged:
                    span = (entry, as_int(row[ocol]), as_int(row[ncol]))
                    spans.extend(span_entry(span, f"{where}: line {line}")[1:])
                builder.append(entry)
                if codes is not None:
                    codes.add(row[lcol])
        if not len(builder):
            raise ValueError(f"{where}: no rows")
        ds = cls.__new__(cls)
        ds._paths = builder.build()
        ds._spans = np.frombuffer(spans, dtype=np.int64).reshape(-1, 2) if ranged else None
        ds._labels, ds.classes = codes.finish() if codes is not None else (None, None)
        return ds

    @classmethod
    def from_dataframe(
        cls,
        df: Any,
        *,
        path_column: str = "path",
        label_column: str | None = None,
        root: StrPath | None = None,
        offset_column: str | None = None,
        length_column: str | None = None,
    ) -> FileDataset:
        """Rows of a pandas DataFrame (pandas is optional: only this method needs it);
        the columns mean what they mean for :meth:`from_csv`."""
        columns = [str(c) for c in getattr(df, "columns", [])]
        where = "from_dataframe"
        check_columns(columns, (path_column, label_column, offset_column, length_column), where)
        paths: list[Any] = [str(p) for p in df[path_column].tolist()]
        if span_columns(offset_column, length_column, where):
            offsets, lengths = df[offset_column].tolist(), df[length_column].tolist()
            paths = [
                span_entry((p, as_int(o), as_int(n)), f"{where}: row {i}")
                for i, (p, o, n) in enumerate(zip(paths, offsets, lengths, strict=True))
            ]
        raw = df[label_column].tolist() if label_column is not None else None
        return cls._from_columns(paths, raw, root, where)

    @classmethod
    def _from_columns(
        cls, paths: list[Any], raw: list[Any] | None, root: StrPath | None, where: str
    ) -> FileDataset:
        if not paths:
            raise ValueError(f"{where}: no rows")
        if raw is None:
            return cls(paths, root=root)
        # CSV gives strings: "3" is the integer label 3, not a class name.
        values = [int(v) if isinstance(v, str) and v.strip().lstrip("-").isdigit() else v for v in raw]
        labels, classes = labels_to_indices(values, where)
        return cls(paths, labels, root=root, classes=classes)


def _not_there(path: Path) -> str:
    """``'trian' does not exist (...)``: the path as given, and where it was looked for; a
    relative path resolves against the working directory, which is not the script's folder
    (``python ../x/train.py``)."""
    given = os.fspath(path)
    what = "is not a folder" if path.exists() else "does not exist"
    if path.is_absolute():
        return f"{given!r} {what}"
    where = f"looked for at {os.path.abspath(given)!r}; the working directory is {os.getcwd()!r}"
    return f"{given!r} {what} ({where})"


def _join(root: str, name: str) -> str:
    """A class folder's path or URL prefix under ``root``."""
    return root.rstrip("/") + "/" + name if is_remote(root) else os.path.join(root, name)


def _walk(folder: Path) -> list[str]:
    """Every file under ``folder``, sorted, hidden files and folders (``.name``) left out."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found.extend(os.path.join(dirpath, f) for f in filenames if not f.startswith("."))
    found.sort()
    return found
