"""``benchmarks/gpu_decode_profile.py``: it skips cleanly without CUDA or nvImageCodec, its
pure parts (the data, the windows, the timing, the table, the profile), and its whole run on
the CPU through the stand-in for nvImageCodec of test_nvimgcodec.py, for the logic a GPU
machine would run."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import load_benchmark, script_env
from PIL import Image
from test_nvimgcodec import FakeCodec, FakeStream

from aioloader import ImageDecoder
from aioloader.decode.jpeg import jpeg_complete, jpeg_header
from aioloader.decode.ondevice import sample_generator

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_decode_profile.py"


profile = load_benchmark("gpu_decode_profile")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here: the script would run, not skip")
def test_skips_cleanly_without_cuda() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, env=script_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "gpu_decode_profile: skipped: no CUDA device"


def test_skips_cleanly_without_nvimagecodec(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    assert profile.main([]) == 0
    assert capsys.readouterr().out.startswith("gpu_decode_profile: skipped: nvImageCodec not installed")


def test_bad_arguments_are_usage_errors() -> None:
    for argv in (["--images", "100", "--batch", "128"], ["--batch", "0"], ["--repeats", "0"]):
        with pytest.raises(SystemExit) as e:
            profile.parse_args(argv)
        assert e.value.code == 2


def test_the_data_and_windows_are_the_loaders() -> None:
    datas = profile.make_jpegs(3, seed=1, size=(60, 45))
    assert datas == profile.make_jpegs(3, seed=1, size=(60, 45))
    for data in datas:
        img = Image.open(io.BytesIO(data))
        assert img.format == "JPEG" and img.size == (60, 45) and jpeg_complete(data)
    dec = ImageDecoder(32, crop="random", hflip=True)
    boxes, flips = profile.draw_windows(datas, dec, seed=4)
    assert boxes.shape == (3, 4) and flips.shape == (3,)
    for i, data in enumerate(datas):
        header = jpeg_header(data)
        assert header is not None
        box, flip = dec.window(header.width, header.height, lambda i=i: sample_generator(4, 0, i))
        assert tuple(boxes[i]) == box and bool(flips[i]) == flip
        assert 0 <= box[0] < box[2] <= 60 and 0 <= box[1] < box[3] <= 45


def test_time_stage_measures_each_repeat_and_reports_errors() -> None:
    calls: list[int] = []
    syncs: list[int] = []

    def fn(k: int) -> list[object]:
        calls.append(k)
        time.sleep(0.002)
        return [None, object(), None]

    stage = profile.time_stage("s", fn, batches=2, repeats=3, samples=3, sync=lambda: syncs.append(1))
    assert calls == [0, 0, 1, 0] and len(syncs) == 4  # the warm-up, then the batches in turn
    assert len(stage.call) == 3 and min(stage.call) >= 2.0 and stage.nones == [2, 2, 2]
    assert all(d >= c for d, c in zip(stage.done, stage.call, strict=True))
    assert stage.error is None

    def broken(k: int) -> None:
        raise RuntimeError("no backend\nsecond line")

    bad = profile.time_stage("bad", broken, batches=1, repeats=2, samples=3, sync=lambda: None)
    assert bad.error == "RuntimeError: no backend" and bad.call == []
    text = profile.table([stage, bad])
    lines = text.splitlines()
    assert lines[0].startswith("| stage | call ms |") and len(lines) == 4
    assert lines[2].startswith("| s | ") and lines[2].endswith("| 2 |")
    assert lines[3].startswith("| bad | n/a: RuntimeError: no backend |")
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_nones_of() -> None:
    assert profile.nones_of([None, 1.5, None]) == 2
    assert profile.nones_of([3, 5]) == 2  # aioloader's failed positions
    assert profile.nones_of([]) == 0 and profile.nones_of(("a", None)) == 0


def test_loaded_libraries_reads_the_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 12 /site/nvidia/cu13/lib/libnvjpeg.so.13\n"
        "7f01-7f02 r--p 00001000 08:01 12 /site/nvidia/cu13/lib/libnvjpeg.so.13\n"
        "7f02-7f03 r-xp 00000000 08:01 13 /tv/torchvision.libs/libnvjpeg.90286a3c.so.13\n"
        "7f03-7f04 r-xp 00000000 08:01 14 /site/nvidia/nvimgcodec/extensions/libnvjpeg_ext.so.0.9.0\n"
        "7f04-7f05 rw-p 00000000 00:00 0 \n"
        "7f05-7f06 r-xp 00000000 08:01 15 /usr/lib/libc.so.6\n"
    )
    assert profile.loaded_libraries("nvjpeg", str(maps)) == [
        "/site/nvidia/cu13/lib/libnvjpeg.so.13",
        "/site/nvidia/nvimgcodec/extensions/libnvjpeg_ext.so.0.9.0",
        "/tv/torchvision.libs/libnvjpeg.90286a3c.so.13",
    ]
    assert profile.loaded_libraries("nvjpeg", str(tmp_path / "none")) == []


def test_top_profile_names_the_functions() -> None:
    def busy_function() -> int:
        return sum(range(10000))

    text = profile.top_profile(busy_function, top=5)
    assert "busy_function" in text and "cumulative" in text


def test_whole_run_through_a_stand_in_codec(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every stage on the CPU through FakeCodec (Pillow): the GPU-only backends it lacks are
    a stage's "n/a", every other stage has its row; both profiles are printed."""
    fake = FakeCodec()
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", fake)
    monkeypatch.setattr(profile, "SIZE", (120, 90))
    args = profile.parse_args(["--images", "8", "--batch", "4", "--repeats", "2", "--profile-batches", "1"])
    assert profile.run(args, fake, torch.device("cpu", 0), FakeStream(), lambda: None) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0][2:]: line for line in out.splitlines() if line.startswith("| ")}
    names = ["a nvimgcodec whole", "b nvimgcodec roi", "b3 nvimgcodec roi, enable_roi_fancy_upsampling=1"]
    names += ["b4 nvimgcodec roi, all CPU threads", "c aioloader whole", "c2 aioloader roi"]
    names += ["d host prep whole", "d2 host prep roi", "e finish loop"]
    for name in names:
        assert "n/a" not in rows[name] and rows[name].endswith("| 0 |"), rows[name]
    for name in ("a2 nvimgcodec whole, gpu backends", "b2 nvimgcodec roi, gpu backends"):
        assert "n/a: " in rows[name]  # the stand-in has no Backend
    assert out.count("## cProfile") == 2 and "decode" in out
    assert "gpu_decode_profile: done in" in out and "# nvJPEG libraries loaded: " in out
    assert np.isfinite([float(rows["c aioloader whole"].split(" | ")[2])]).all()
