"""aioloader.dataset.FileDataset: lists, folders, CSV files and DataFrames."""

from __future__ import annotations

import csv
import gc
import os
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from aioloader import IMAGE_EXTENSIONS, FileDataset


def _touch(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _write_csv(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# -- from a list -----------------------------------------------------------------------------


def test_from_list_without_labels() -> None:
    ds = FileDataset(["a.jpg", Path("b.jpg")])
    assert len(ds) == 2
    assert list(ds.paths) == ["a.jpg", "b.jpg"]
    assert all(isinstance(p, str) for p in ds.paths)
    assert ds[0] == ("a.jpg", None)
    assert ds[1] == ("b.jpg", None)
    assert ds.path(1) == "b.jpg"
    assert ds.label(0) is None
    assert ds.labels is None
    assert not ds.has_labels
    assert ds.classes is None
    assert ds.class_to_idx is None
    assert "2 files" in repr(ds)


def test_from_list_with_labels() -> None:
    ds = FileDataset(["a.jpg", "b.jpg", "c.jpg"], labels=[2, 0, 1])
    assert ds.has_labels
    assert ds.labels is not None
    assert ds.labels.dtype == np.int64
    assert ds.labels.tolist() == [2, 0, 1]
    assert ds[0] == ("a.jpg", 2)
    assert ds[2] == ("c.jpg", 1)
    label = ds.label(1)
    assert label == 0
    assert type(label) is int


def test_from_numpy_labels_and_a_generator_of_paths() -> None:
    ds = FileDataset((f"{i}.png" for i in range(2)), labels=np.array([5, 6], dtype=np.int32))
    assert list(ds.paths) == ["0.png", "1.png"]
    assert ds.labels is not None
    assert ds.labels.dtype == np.int64
    assert ds.labels.tolist() == [5, 6]


def test_empty_dataset_raises() -> None:
    with pytest.raises(ValueError, match="empty"):
        FileDataset([])


def test_bad_label_length_raises() -> None:
    for labels in ([0], [0, 1, 2], [[0, 1]], []):
        with pytest.raises(ValueError, match=r"labels has \d+ entries but there are 2 paths"):
            FileDataset(["a", "b"], labels=labels)  # type: ignore[arg-type]


def test_non_integer_labels_raise() -> None:
    with pytest.raises(TypeError, match="labels must be integers"):
        FileDataset(["a", "b"], labels=[0.5, 1.5])  # type: ignore[list-item]


def test_non_path_entry_raises_naming_it() -> None:
    with pytest.raises(TypeError, match=r"int: 5"):
        FileDataset(["a", 5])  # type: ignore[list-item]


def test_root_resolves_relative_paths_only(tmp_path: Path) -> None:
    absolute = os.fspath(tmp_path / "elsewhere" / "x.jpg")
    ds = FileDataset(["a.jpg", "sub/b.jpg", absolute], root=tmp_path / "data")
    assert ds.paths[0] == os.fspath(tmp_path / "data" / "a.jpg")
    assert ds.paths[1] == os.fspath(tmp_path / "data" / "sub" / "b.jpg")
    assert ds.paths[2] == absolute
    ds = FileDataset(["a.jpg"], root=os.fspath(tmp_path))  # root as a string
    assert ds.paths == [os.fspath(tmp_path / "a.jpg")]


def test_explicit_classes() -> None:
    ds = FileDataset(["a", "b"], labels=[1, 0], classes=["cat", "dog"])
    assert ds.classes == ["cat", "dog"]
    assert ds.class_to_idx == {"cat": 0, "dog": 1}
    assert "classes=2" in repr(ds)


# -- from_folder -----------------------------------------------------------------------------


def test_from_folder_classes_sorted_to_labels(tmp_path: Path) -> None:
    # Created in non-sorted order; labels follow the sorted names.
    for cls, names in [("zebra", ["z1.jpg"]), ("ant", ["a2.jpg", "a1.jpg"]), ("moth", ["m1.png"])]:
        for name in names:
            _touch(tmp_path / cls / name)
    ds = FileDataset.from_folder(tmp_path)
    assert ds.classes == ["ant", "moth", "zebra"]
    assert ds.class_to_idx == {"ant": 0, "moth": 1, "zebra": 2}
    rel = [os.path.relpath(p, tmp_path) for p in ds.paths]
    assert rel == [
        os.path.join("ant", "a1.jpg"),
        os.path.join("ant", "a2.jpg"),
        os.path.join("moth", "m1.png"),
        os.path.join("zebra", "z1.jpg"),
    ]
    assert ds.labels is not None
    assert ds.labels.tolist() == [0, 0, 1, 2]


def test_from_folder_with_synthetic_images(image_folder: Path) -> None:
    ds = FileDataset.from_folder(image_folder)
    assert len(ds) == 30
    assert ds.classes == ["class_00", "class_01", "class_02"]
    assert ds.labels is not None
    assert np.bincount(ds.labels).tolist() == [10, 10, 10]
    for path, label in (ds[i] for i in range(len(ds))):
        assert os.path.basename(os.path.dirname(path)) == f"class_{label:02d}"


def test_from_folder_extension_filter_is_case_insensitive(tmp_path: Path) -> None:
    for name in ["a.JPG", "b.jpeg", "c.Png", "d.txt", "e.json", "f", "g.WebP"]:
        _touch(tmp_path / "c0" / name)
    ds = FileDataset.from_folder(tmp_path)
    assert sorted(os.path.basename(p) for p in ds.paths) == ["a.JPG", "b.jpeg", "c.Png", "g.WebP"]


def test_from_folder_custom_extensions_with_or_without_dot(tmp_path: Path) -> None:
    for name in ["a.TXT", "b.txt", "c.jpg", "d.npy"]:
        _touch(tmp_path / "c0" / name)
    ds = FileDataset.from_folder(tmp_path, extensions=["txt", ".NPY"])
    assert sorted(os.path.basename(p) for p in ds.paths) == ["a.TXT", "b.txt", "d.npy"]


def test_from_folder_extensions_none_keeps_every_visible_file(tmp_path: Path) -> None:
    for name in ["a.jpg", "b.txt", "noext", ".hidden.jpg"]:
        _touch(tmp_path / "c0" / name)
    ds = FileDataset.from_folder(tmp_path, extensions=None)
    assert sorted(os.path.basename(p) for p in ds.paths) == ["a.jpg", "b.txt", "noext"]


def test_default_extensions() -> None:
    assert {".jpg", ".jpeg", ".png"} <= IMAGE_EXTENSIONS
    assert all(e == e.lower() and e.startswith(".") for e in IMAGE_EXTENSIONS)


def test_from_folder_skips_hidden_files_and_folders(tmp_path: Path) -> None:
    _touch(tmp_path / "cat" / "1.jpg")
    _touch(tmp_path / "cat" / ".2.jpg")  # hidden file
    _touch(tmp_path / "cat" / ".thumbs" / "3.jpg")  # file inside a hidden sub-folder
    _touch(tmp_path / "cat" / "ok" / ".deep" / "4.jpg")  # hidden folder deeper down
    _touch(tmp_path / ".git" / "5.jpg")  # hidden class folder
    _touch(tmp_path / ".ipynb_checkpoints" / "6.jpg")
    _touch(tmp_path / "dog" / "7.jpg")
    _touch(tmp_path / "loose.jpg")  # a file at the top is not a class
    ds = FileDataset.from_folder(tmp_path)
    assert ds.classes == ["cat", "dog"]
    assert sorted(os.path.basename(p) for p in ds.paths) == ["1.jpg", "7.jpg"]


def test_from_folder_nested_sub_folders(tmp_path: Path) -> None:
    _touch(tmp_path / "a" / "x" / "y" / "deep.jpg")
    _touch(tmp_path / "a" / "top.jpg")
    _touch(tmp_path / "a" / "x" / "mid.jpg")
    _touch(tmp_path / "b" / "2024" / "01" / "b.png")
    ds = FileDataset.from_folder(tmp_path)
    found = {os.path.relpath(p, tmp_path): lab for p, lab in (ds[i] for i in range(len(ds)))}
    assert found == {
        os.path.join("a", "x", "y", "deep.jpg"): 0,
        os.path.join("a", "top.jpg"): 0,
        os.path.join("a", "x", "mid.jpg"): 0,
        os.path.join("b", "2024", "01", "b.png"): 1,
    }
    # Sorted within a class, so the order does not depend on the file system.
    class_a = [p for p, lab in (ds[i] for i in range(len(ds))) if lab == 0]
    assert class_a == sorted(class_a)


def test_from_folder_order_is_stable(tmp_path: Path) -> None:
    names = [f"{i:03d}.jpg" for i in range(40)]
    for name in reversed(names):
        _touch(tmp_path / "c" / name)
    a = FileDataset.from_folder(tmp_path)
    b = FileDataset.from_folder(tmp_path)
    assert list(a.paths) == list(b.paths)
    assert [os.path.basename(p) for p in a.paths] == names


def test_from_folder_an_empty_class_folder_is_an_error_naming_it(tmp_path: Path) -> None:
    """As torchvision's ImageFolder: a class no file is in (here one of .txt files only)
    would be a label that never occurs."""
    (tmp_path / "b_empty").mkdir()
    _touch(tmp_path / "a" / "1.jpg")
    _touch(tmp_path / "c" / "2.jpg")
    _touch(tmp_path / "d_notes" / "notes.txt")
    with pytest.raises(
        ValueError, match=r"2 class folder\(s\) under .* hold no files with extensions"
    ) as info:
        FileDataset.from_folder(tmp_path)
    named = [os.fspath(tmp_path / "b_empty"), os.fspath(tmp_path / "d_notes")]
    assert all(repr(folder) in str(info.value) for folder in named)
    assert repr(os.fspath(tmp_path / "a")) not in str(info.value)
    # extensions=None counts every file: only the folder with none is named.
    with pytest.raises(ValueError, match=r"1 class folder\(s\) .* hold no files: ") as info:
        FileDataset.from_folder(tmp_path, extensions=None)
    assert repr(named[0]) in str(info.value) and repr(named[1]) not in str(info.value)


def test_from_folder_missing_root(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=re.escape(repr(os.fspath(missing)))):
        FileDataset.from_folder(missing)
    f = _touch(tmp_path / "file.jpg")  # a file is not a root folder either
    with pytest.raises(FileNotFoundError, match=r"file\.jpg' is not a folder"):
        FileDataset.from_folder(f)


def test_a_relative_root_that_is_missing_names_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python ../x/train.py``: a relative path resolves against the working directory,
    not the script's folder; the error says both."""
    (tmp_path / "train" / "a").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "train")
    with pytest.raises(FileNotFoundError) as info:
        FileDataset.from_folder("trian")
    cwd = os.fspath(tmp_path / "train")
    assert str(info.value) == (
        f"from_folder: root folder 'trian' does not exist (looked for at "
        f"{os.path.join(cwd, 'trian')!r}; the working directory is {cwd!r})"
    )


def test_from_folder_no_class_folders(tmp_path: Path) -> None:
    _touch(tmp_path / "a.jpg")
    (tmp_path / ".hidden").mkdir()
    with pytest.raises(ValueError, match="no class sub-folders"):
        FileDataset.from_folder(tmp_path)


def test_from_folder_no_matching_files(tmp_path: Path) -> None:
    _touch(tmp_path / "a" / "notes.txt")
    _touch(tmp_path / "b" / ".hidden.jpg")
    (tmp_path / "c").mkdir()
    with pytest.raises(ValueError, match=r"no files with extensions .*\.jpg") as info:
        FileDataset.from_folder(tmp_path)
    assert os.fspath(tmp_path) in str(info.value)


# -- from_csv --------------------------------------------------------------------------------


def test_from_csv_relative_paths_resolve_against_csv_folder(tmp_path: Path) -> None:
    csv_path = _write_csv(
        tmp_path / "meta" / "index.csv",
        f"path,label\nimg/a.jpg,0\nb.jpg,1\n{tmp_path / 'abs.jpg'},1\n",
    )
    ds = FileDataset.from_csv(csv_path, label_column="label")
    assert list(ds.paths) == [
        os.fspath(tmp_path / "meta" / "img" / "a.jpg"),
        os.fspath(tmp_path / "meta" / "b.jpg"),
        os.fspath(tmp_path / "abs.jpg"),
    ]
    assert ds.labels is not None
    assert ds.labels.tolist() == [0, 1, 1]
    assert ds.classes is None  # integer labels: no class names


def test_from_csv_root_overrides_csv_folder(tmp_path: Path) -> None:
    csv_path = _write_csv(tmp_path / "meta" / "index.csv", "path\na.jpg\nsub/b.jpg\n")
    ds = FileDataset.from_csv(csv_path, root=tmp_path / "data")
    assert list(ds.paths) == [
        os.fspath(tmp_path / "data" / "a.jpg"),
        os.fspath(tmp_path / "data" / "sub" / "b.jpg"),
    ]
    assert not ds.has_labels


def test_from_csv_without_label_column_ignores_labels(tmp_path: Path) -> None:
    csv_path = _write_csv(tmp_path / "i.csv", "path,label\na.jpg,cat\n")
    ds = FileDataset.from_csv(csv_path)
    assert not ds.has_labels
    assert ds.classes is None


def test_from_csv_custom_columns(tmp_path: Path) -> None:
    csv_path = _write_csv(tmp_path / "i.csv", "id,file,y\n1,a.jpg,3\n2,b.jpg,-1\n")
    ds = FileDataset.from_csv(csv_path, path_column="file", label_column="y")
    assert [os.path.basename(p) for p in ds.paths] == ["a.jpg", "b.jpg"]
    assert ds.labels is not None
    assert ds.labels.tolist() == [3, -1]


def test_from_csv_string_labels_map_to_sorted_classes(tmp_path: Path) -> None:
    csv_path = _write_csv(tmp_path / "i.csv", "path,label\na,dog\nb,cat\nc,emu\nd,cat\n")
    ds = FileDataset.from_csv(csv_path, label_column="label")
    assert ds.classes == ["cat", "dog", "emu"]
    assert ds.class_to_idx == {"cat": 0, "dog": 1, "emu": 2}
    assert ds.labels is not None
    assert ds.labels.tolist() == [1, 0, 2, 0]


def test_from_csv_quoted_fields(tmp_path: Path) -> None:
    csv_path = _write_csv(tmp_path / "i.csv", 'path,label\n"a, b.jpg","x y"\n')
    ds = FileDataset.from_csv(csv_path, label_column="label")
    assert os.path.basename(ds.paths[0]) == "a, b.jpg"
    assert ds.classes == ["x y"]


def test_from_csv_empty_label_cell_raises(tmp_path: Path) -> None:
    for i, text in enumerate(["a,cat\nb,\nc,dog\n", "a,1\nb,\n", "a,cat\nb,  \n"]):
        csv_path = _write_csv(tmp_path / f"{i}.csv", "path,label\n" + text)
        with pytest.raises(ValueError, match="some labels are missing"):
            FileDataset.from_csv(csv_path, label_column="label")


def test_from_csv_short_row_label_missing_raises(tmp_path: Path) -> None:
    csv_path = _write_csv(tmp_path / "i.csv", "path,label\na,cat\nb\n")
    with pytest.raises(ValueError, match="missing"):
        FileDataset.from_csv(csv_path, label_column="label")


def test_from_csv_missing_column_names_it(tmp_path: Path) -> None:
    csv_path = _write_csv(tmp_path / "i.csv", "path,label\na,0\n")
    for column in ("path_column", "label_column"):
        kwargs = {column: "nosuchcol"}
        with pytest.raises(
            ValueError, match=r"column 'nosuchcol' not found; columns are \['path', 'label'\]"
        ):
            FileDataset.from_csv(csv_path, **kwargs)  # type: ignore[arg-type]


def test_from_csv_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.csv"
    with pytest.raises(FileNotFoundError, match=re.escape(repr(os.fspath(missing)))):
        FileDataset.from_csv(missing)


def test_from_csv_empty_raises(tmp_path: Path) -> None:
    header_only = _write_csv(tmp_path / "h.csv", "path,label\n")
    with pytest.raises(ValueError, match="no rows"):
        FileDataset.from_csv(header_only, label_column="label")
    with pytest.raises(ValueError, match="no rows"):
        FileDataset.from_csv(header_only)
    empty = _write_csv(tmp_path / "e.csv", "")
    with pytest.raises(ValueError, match="'path'"):
        FileDataset.from_csv(empty)


# -- from_dataframe --------------------------------------------------------------------------


def test_from_dataframe_integer_labels() -> None:
    df = pd.DataFrame({"path": ["a.jpg", "b.jpg"], "label": [3, 1]})
    ds = FileDataset.from_dataframe(df, label_column="label")
    assert list(ds.paths) == ["a.jpg", "b.jpg"]  # no root: left as given
    assert ds.labels is not None
    assert ds.labels.tolist() == [3, 1]
    assert ds.classes is None


def test_from_dataframe_string_labels() -> None:
    df = pd.DataFrame({"file": ["a", "b", "c"], "y": ["pear", "apple", "pear"]})
    ds = FileDataset.from_dataframe(df, path_column="file", label_column="y")
    assert ds.classes == ["apple", "pear"]
    assert ds.labels is not None
    assert ds.labels.tolist() == [1, 0, 1]


def test_from_dataframe_without_labels_and_root(tmp_path: Path) -> None:
    df = pd.DataFrame({"path": ["a.jpg", "x/b.jpg"]})
    ds = FileDataset.from_dataframe(df, root=tmp_path)
    assert list(ds.paths) == [os.fspath(tmp_path / "a.jpg"), os.fspath(tmp_path / "x" / "b.jpg")]
    assert not ds.has_labels


def test_from_dataframe_nan_label_raises() -> None:
    df = pd.DataFrame({"path": ["a", "b"], "label": ["cat", None]})
    with pytest.raises(ValueError, match="missing"):
        FileDataset.from_dataframe(df, label_column="label")


def test_from_dataframe_missing_column_names_it() -> None:
    df = pd.DataFrame({"path": ["a"], "label": [0]})
    for column in ("path_column", "label_column"):
        with pytest.raises(ValueError, match=r"from_dataframe: column 'zzz' not found"):
            FileDataset.from_dataframe(df, **{column: "zzz"})  # type: ignore[arg-type]


def test_from_dataframe_empty_raises() -> None:
    df = pd.DataFrame({"path": [], "label": []})
    with pytest.raises(ValueError, match="no rows"):
        FileDataset.from_dataframe(df, label_column="label")


def test_entries_may_be_byte_spans_of_a_file() -> None:
    ds = FileDataset(["a.jpg", ("shard.tar", 512, 100), ("s3://b/shard.tar", 0, 7)], root="/data")
    assert ds.paths == ["/data/a.jpg", "/data/shard.tar", "s3://b/shard.tar"]
    assert [ds.span(i) for i in range(3)] == [None, (512, 100), (0, 7)] and ds.has_spans
    assert not FileDataset(["a.jpg"]).has_spans and FileDataset(["a.jpg"]).span(0) is None
    with pytest.raises(ValueError, match=r"offset=-1 of 'x' must be a non-negative integer"):
        FileDataset([("x", -1, 3)])
    with pytest.raises(ValueError, match="length=0 of 'x'"):
        FileDataset([("x", 0, 0)])
    with pytest.raises(TypeError, match=r"a ranged entry is \(path, offset, length\)"):
        FileDataset([("x", 1)])  # type: ignore[list-item]


def test_from_csv_and_from_dataframe_read_byte_range_columns(tmp_path: Path) -> None:
    """An index of a shard (its path, each sample's offset and length, a label): the same
    entries from a CSV and from a DataFrame, URLs kept as they are."""
    rows = [
        ("shard-0.tar", 512, 100, "cat"),
        ("s3://bucket/shard-1.tar", 0, 7, "dog"),
        ("shard-0.tar", 1024, 30, "cat"),
    ]
    csv_path = tmp_path / "index.csv"
    csv_path.write_text("path,offset,length,label\n" + "".join(f"{p},{o},{n},{y}\n" for p, o, n, y in rows))
    from_csv = FileDataset.from_csv(
        csv_path, label_column="label", offset_column="offset", length_column="length"
    )
    df = pd.DataFrame(rows, columns=["path", "offset", "length", "label"])
    from_df = FileDataset.from_dataframe(
        df, label_column="label", root=tmp_path, offset_column="offset", length_column="length"
    )
    for ds in (from_csv, from_df):
        assert ds.has_spans
        assert [ds.path(i) for i in range(3)] == [
            os.fspath(tmp_path / "shard-0.tar"),
            "s3://bucket/shard-1.tar",
            os.fspath(tmp_path / "shard-0.tar"),
        ]
        assert [ds.span(i) for i in range(3)] == [(512, 100), (0, 7), (1024, 30)]
        assert ds.classes == ["cat", "dog"] and ds.labels is not None and ds.labels.tolist() == [0, 1, 0]


def test_byte_range_columns_are_checked_with_the_row_named(tmp_path: Path) -> None:
    csv_path = tmp_path / "index.csv"
    csv_path.write_text("path,offset,length\na.tar,0,10\na.tar,ten,10\n")
    with pytest.raises(ValueError, match=r"line 3: offset='ten' of .*a\.tar' must be a non-negative integer"):
        FileDataset.from_csv(csv_path, offset_column="offset", length_column="length")
    with pytest.raises(ValueError, match="offset_column='offset' and length_column=None go together"):
        FileDataset.from_csv(csv_path, offset_column="offset")
    with pytest.raises(ValueError, match=r"column 'size' not found"):
        FileDataset.from_csv(csv_path, offset_column="offset", length_column="size")
    df = pd.DataFrame({"path": ["a.tar", "a.tar"], "offset": [0, 5], "length": [10, 0]})
    with pytest.raises(ValueError, match=r"row 1: length=0 of 'a\.tar'"):
        FileDataset.from_dataframe(df, offset_column="offset", length_column="length")


def test_a_loader_reads_datasets_from_csv_whole_files_and_byte_ranges(
    tmp_path: Path, numbered: list[str]
) -> None:
    """The numbered files listed in a CSV, then the same samples as byte ranges of one
    shard listed in another: both load, in order, with their labels."""
    from helpers import decode_number

    from aioloader import Loader

    whole = tmp_path / "whole.csv"
    whole.write_text("path,label\n" + "".join(f"{p},{i}\n" for i, p in enumerate(numbered)))
    shard = tmp_path / "shard.bin"
    lines = []
    with open(shard, "wb") as f:
        for i, p in enumerate(numbered):
            f.write(b"--")
            data = Path(p).read_bytes()
            lines.append(f"shard.bin,{f.tell()},{len(data)},{i}\n")
            f.write(data)
    ranged = tmp_path / "ranged.csv"
    ranged.write_text("path,offset,length,label\n" + "".join(lines))
    datasets = [
        FileDataset.from_csv(whole, label_column="label"),
        FileDataset.from_csv(ranged, label_column="label", offset_column="offset", length_column="length"),
    ]
    for ds in datasets:
        with Loader(ds, batch_size=4, decode=decode_number, shuffle=False, num_workers=1) as loader:
            got = [(int(v), int(y)) for x, labels in loader for v, y in zip(x, labels, strict=True)]
        assert got == [(i, i) for i in range(len(numbered))]


def test_a_large_index_costs_about_40_bytes_a_file(tmp_path: Path) -> None:
    """docs/benchmarks.md ("Memory": a 30 M-file index): a 200,000-row CSV of ImageNet-like
    paths (1,000 class folders, 21-character file names) with string labels is held in about
    40 bytes a file, labels included (a ``list[str]`` of the same paths alone takes over
    100), and is read streaming: at no point does it cost what a list of the paths would."""
    n = 200_000
    index = tmp_path / "index.csv"
    with open(index, "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["path", "label"])
        for i in range(n):
            wnid = f"n{1440764 + i % 1000:08d}"
            rows.writerow([f"train/{wnid}/{wnid}_{i:06d}.JPEG", wnid])
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ds = FileDataset.from_csv(index, label_column="label")
        gc.collect()
        held, peak = (m - before for m in tracemalloc.get_traced_memory())
    finally:
        tracemalloc.stop()
    assert len(ds) == n and ds.classes is not None and len(ds.classes) == 1000
    assert ds.path(n - 1) == os.path.join(str(tmp_path), "train", "n01441763", "n01441763_199999.JPEG")
    assert ds.labels is not None and ds.labels[n - 1] == 999
    assert held / n < 42, f"{held / n:.1f} bytes a file"
    assert peak / n < 64, f"{peak / n:.1f} bytes a file at the peak"


def test_paths_of_a_batch_match_one_by_one() -> None:
    """``paths_of`` (a batch's paths at once) gives what ``path`` gives each: folders, bare
    names, non-UTF-8 names, negative indices; an index out of range is an IndexError."""
    paths = ["a/x.jpg", "y.jpg", "/abs/b/ü.png", "a/" + os.fsdecode(b"\xff.bin"), "s3://bucket/k/z.jpg"]
    ds = FileDataset(paths)
    picks = [4, 0, 2, 2, 1, 3, -1, -5]
    assert ds.paths_of(picks) == [ds.path(i) for i in picks]
    assert ds.paths_of(np.array(picks)) == [ds.path(i) for i in picks]
    assert ds.paths_of([]) == []
    for bad in ([5], [0, -6]):
        with pytest.raises(IndexError, match="out of range"):
            ds.paths_of(bad)
