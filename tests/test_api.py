"""The public surface: ``aioloader.__all__``, typing marker, error hierarchy, pickling."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.resources
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import decode_number, script_env

import aioloader
from aioloader import (
    CollateError,
    DecodeError,
    LoaderClosedError,
    LoaderError,
    LoaderTimeoutError,
    ReadError,
    SampleError,
    WorkerCrashedError,
)

EXPECTED_ALL = {
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
}


def test_all_is_exactly_the_curated_list() -> None:
    assert set(aioloader.__all__) == EXPECTED_ALL
    assert len(aioloader.__all__) == len(EXPECTED_ALL)  # no duplicates


def test_every_public_name_is_importable() -> None:
    module = importlib.import_module("aioloader")
    for name in EXPECTED_ALL:
        assert getattr(module, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from aioloader import *", namespace)
    assert set(namespace) >= EXPECTED_ALL


def test_public_names_are_the_right_objects() -> None:
    from aioloader.collate import default_collate
    from aioloader.loader import Loader

    assert aioloader.Loader is Loader
    assert aioloader.default_collate is default_collate
    assert callable(aioloader.sample_rng)
    assert isinstance(aioloader.IMAGE_EXTENSIONS, frozenset)
    assert "default_collate" in dir(aioloader) and "Loader" in dir(aioloader)


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        aioloader.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def test_importing_the_package_does_not_import_torch() -> None:
    """Decode workers import aioloader; only Loader and default_collate need torch."""
    code = (
        "import sys, aioloader\n"
        "from aioloader import FileDataset, ImageDecoder, LoaderStats, sample_rng, IMAGE_EXTENSIONS\n"
        "from aioloader import LoaderError, SampleError, DecodeError\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=script_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_version_matches_package_metadata() -> None:
    assert isinstance(aioloader.__version__, str)
    assert aioloader.__version__ == importlib.metadata.version("aioloader")


def test_py_typed_ships_in_the_package() -> None:
    marker = Path(aioloader.__file__).parent / "py.typed"
    assert marker.is_file()
    resource = importlib.resources.files("aioloader") / "py.typed"
    assert resource.is_file()


# Parent of each error, as drawn in aioloader/errors.py's docstring.
HIERARCHY = {
    LoaderError: Exception,
    LoaderClosedError: LoaderError,
    SampleError: LoaderError,
    ReadError: SampleError,
    DecodeError: SampleError,
    LoaderTimeoutError: SampleError,
    CollateError: LoaderError,
    WorkerCrashedError: LoaderError,
}


def test_error_hierarchy_matches_the_docstring_tree() -> None:
    # Each class's one base is its parent in the tree; the rest (a ReadError is a LoaderError,
    # a WorkerCrashedError is no SampleError) follows, Python's doing.
    for cls, parent in HIERARCHY.items():
        assert cls.__bases__ == (parent,), cls


def test_docstring_tree_names_every_error() -> None:
    import aioloader.errors as errors_module

    doc = errors_module.__doc__ or ""
    for cls in HIERARCHY:
        assert cls.__name__ in doc, cls
    assert set(errors_module.__all__) == {cls.__name__ for cls in HIERARCHY}


def test_errors_are_exported_from_the_package() -> None:
    import aioloader.errors as errors_module

    for name in errors_module.__all__:
        assert getattr(aioloader, name) is getattr(errors_module, name)


SAMPLE_ERRORS = [SampleError, ReadError, DecodeError, LoaderTimeoutError]


def test_sample_errors_carry_path_and_index() -> None:
    for cls in SAMPLE_ERRORS:
        err = cls("could not read", path="/data/x.jpg", index=41)
        assert err.path == "/data/x.jpg"
        assert err.index == 41
        assert str(err) == "could not read (sample 41: '/data/x.jpg')"


def test_sample_errors_pickle_round_trip() -> None:
    for cls in SAMPLE_ERRORS:
        err = cls("boom", path="dir/é ü.png", index=7)
        for protocol in (2, pickle.HIGHEST_PROTOCOL):
            copy = pickle.loads(pickle.dumps(err, protocol=protocol))
            assert type(copy) is cls
            assert copy.path == "dir/é ü.png"
            assert copy.index == 7
            assert str(copy) == str(err)
            assert copy.args == err.args
            # A second round trip does not nest the "(sample ...)" suffix again.
            again = pickle.loads(pickle.dumps(copy, protocol=protocol))
            assert str(again) == str(err)
            assert isinstance(copy, LoaderError)


def test_decode_error_pickle_keeps_worker_traceback() -> None:
    err = DecodeError("decode failed", path="a.jpg", index=1)
    err.worker_traceback = "Traceback (most recent call last):\n  ValueError: bad"
    copy = pickle.loads(pickle.dumps(err))
    assert copy.worker_traceback == err.worker_traceback
    assert copy.path == "a.jpg" and copy.index == 1 and str(copy) == str(err)
    assert DecodeError("x", path="p", index=0).worker_traceback == ""  # default when unset


def test_a_raised_sample_error_ends_with_the_skip_hint_and_its_summary_is_one_line() -> None:
    err = DecodeError("decode failed: ValueError: bad", path="a.jpg", index=1)
    err.worker_traceback = "Traceback (most recent call last):\n  ValueError: bad\n"
    err.hint = "pass on_error"
    copy = pickle.loads(pickle.dumps(err))
    assert copy.summary == "decode failed: ValueError: bad (sample 1: 'a.jpg')"
    assert str(copy).splitlines() == [
        copy.summary,
        "--- worker traceback ---",
        "Traceback (most recent call last):",
        "  ValueError: bad",
        "pass on_error",
    ]


def test_a_collate_error_pickles_with_its_batch_and_files() -> None:
    err = CollateError("collate failed for batch 2: ...", batch=2, paths=("a.png", "b.jpg"))
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), str(copy), copy.batch, copy.paths) == (CollateError, str(err), 2, ("a.png", "b.jpg"))


def test_other_errors_pickle_round_trip() -> None:
    for cls in (LoaderError, LoaderClosedError, WorkerCrashedError):
        err = cls("something happened")
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is cls
        assert str(copy) == "something happened"


@pytest.mark.parametrize("catch", [LoaderError, SampleError, ReadError])
def test_a_missing_file_is_a_read_error_caught_as_sample_and_loader_error(
    numbered: list[str], tmp_path: Path, catch: type[LoaderError]
) -> None:
    """What the loader raises for a missing file: a ReadError, which ``except SampleError``
    and ``except LoaderError`` catch, naming the file and its index."""
    missing = str(tmp_path / "missing.txt")
    paths = [*numbered[:3], missing]
    with aioloader.Loader(paths, batch_size=2, decode=decode_number, shuffle=False, num_workers=1) as loader:
        it = iter(loader)
        assert [int(v) for v in next(it)] == [0, 1]
        with pytest.raises(catch) as info:
            next(it)
    err = info.value
    assert type(err) is ReadError
    assert (err.path, err.index) == (missing, 3)
    assert err.summary.endswith(f"(sample 3: {missing!r})") and str(err).startswith(err.summary)
    assert 'pass on_error="skip" to the Loader' in str(err).splitlines()[-1]
    assert isinstance(err.__cause__, FileNotFoundError)
