"""Errors that say what to do (issue 42, "A user's first hour"): a folder of JPEGs with a
few bad files, as a new user meets it. A decode error shows its worker's traceback once,
with the user's own file and line, and ends saying that ``on_error="skip"`` exists; each
skipped file is one WARNING line (its traceback at DEBUG); samples of different shapes
name their files."""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import RuntimeWatch, finish_script, start_script
from PIL import Image

from aioloader import CollateError, FileDataset, ImageDecoder, Loader


@pytest.fixture(params=[False, True], ids=["thread", "process"])
def loader_process(request: pytest.FixtureRequest, runtimes: RuntimeWatch) -> bool:
    """Both runtimes (the test fails when a loader ran in the other one: conftest.py)."""
    runtimes.expect(bool(request.param))
    return bool(request.param)


@pytest.fixture
def bad_folder(image_folder: Path, tmp_path: Path) -> Path:
    """A copy of the JPEG folder with two files that are not images."""
    root = tmp_path / "data" / "train"
    shutil.copytree(image_folder, root)
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    (root / names[0] / "broken.jpg").write_bytes(b"not a jpeg at all")
    (root / names[1] / "html.jpg").write_bytes(b"not found: <html></html>")
    return root


SCRIPT = """
import aioloader

decode_image = aioloader.ImageDecoder(32)


def decode_raises(data):
    if data.startswith(b"not"):
        raise ValueError("my decode refuses this file")
    return decode_image(data)


if __name__ == "__main__":
    dataset = aioloader.FileDataset.from_folder("train")
    loader = aioloader.Loader(
        dataset, batch_size=8, decode=decode_raises, shuffle=False, loader_process={where}
    )
    with loader:
        for images, labels in loader:
            pass
"""


@pytest.mark.parametrize("where", ["False", "'auto'"])
def test_a_scripts_decode_error_shows_its_traceback_once_with_the_scripts_line_and_says_skip_exists(
    bad_folder: Path, tmp_path: Path, where: str
) -> None:
    """``python ../x/train.py``: the worker's traceback once, the script's own file, line and
    source line in it (not ``<dynamic-code>``), the bad file named, and the way past it last."""
    text = SCRIPT.format(where=where)
    script = tmp_path / "x" / "train.py"
    script.parent.mkdir()
    proc = start_script(script, text, args=["../x/train.py"], cwd=bad_folder.parent)
    _, err = finish_script(proc)
    assert proc.returncode == 1, err
    raise_line = 1 + text.splitlines().index('        raise ValueError("my decode refuses this file")')
    frames = re.findall(r'File "([^"]+)", line (\d+), in decode_raises', err)
    assert err.count("--- worker traceback ---") == 1 and len(frames) == 1, err
    # The script's path as Python made it absolute ('<cwd>/../x/train.py'), and its line.
    assert os.path.samefile(frames[0][0], script) and int(frames[0][1]) == raise_line
    assert err.count('raise ValueError("my decode refuses this file")') == 1  # linecache read the script
    assert "<dynamic-code>" not in err
    assert "DecodeError: decode failed: ValueError: my decode refuses this file (sample " in err
    assert "broken.jpg')" in err or "html.jpg')" in err
    assert 'pass on_error="skip" to the Loader' in err.strip().splitlines()[-1]


def test_each_skipped_file_is_one_warning_line_and_its_traceback_is_at_debug(
    bad_folder: Path, loader_process: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aioloader")
    dataset = FileDataset.from_folder(bad_folder)
    bad = [p for p in dataset.paths if p.endswith(("broken.jpg", "html.jpg"))]
    with Loader(
        dataset, batch_size=8, decode=ImageDecoder(32), on_error="skip", loader_process=loader_process
    ) as loader:
        for _ in range(2):  # a second epoch warns no more
            delivered = sum(len(labels) for _, labels in loader)
            assert delivered == len(dataset) - len(bad)
    records = [r for r in caplog.records if r.name == "aioloader" and r.getMessage().startswith("skipped")]
    warned = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warned) == len(bad) and all("\n" not in line for line in warned), warned
    assert sorted(next(p for p in bad if repr(p) in line) for line in warned) == sorted(bad)
    assert all("cannot identify image file" in line for line in warned)
    debug = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    assert len(debug) == len(bad) and all("Traceback (most recent call last)" in d for d in debug)


def decode_as_is(data: bytes) -> np.ndarray:
    """Every image at its own size: a batch of mixed sizes cannot be stacked."""
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_a_batch_of_different_shapes_names_the_files_of_each(
    image_folder: Path, tmp_path: Path, loader_process: bool
) -> None:
    root = tmp_path / "train"
    shutil.copytree(image_folder, root)
    odd = root / sorted(p.name for p in root.iterdir() if p.is_dir())[0] / "small.png"
    Image.new("RGB", (40, 30), (9, 9, 9)).save(odd)
    dataset = FileDataset.from_folder(root)
    at = list(dataset.paths).index(str(odd))
    with (
        Loader(
            dataset, batch_size=8, decode=decode_as_is, shuffle=False, loader_process=loader_process
        ) as loader,
        pytest.raises(CollateError) as info,
    ):
        list(loader)
    err = info.value
    assert err.batch == at // 8 and err.paths[0] == str(odd)
    assert f"(30, 40, 3) in 1 sample: {str(odd)!r}" in str(err)
    assert all(repr(p) in str(err) for p in err.paths) and len(err.paths) > 1
    assert isinstance(err.__cause__, ValueError) and "different shapes" in str(err.__cause__)
