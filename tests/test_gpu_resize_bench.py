"""``benchmarks/gpu_resize.py``: a whole run, small, on this machine (the counts on the CPU;
the CUDA timings where there is a GPU), its boxes, and its argument errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import load_benchmark, script_env

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_resize.py"
gpu_resize = load_benchmark("gpu_resize")


def test_a_small_run_prints_every_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_resize.main(["--batch", "4", "--size", "61x47", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for resample in ("nearest", "bilinear", "bicubic", "lanczos"):
        assert f"| {resample} |" in out
    assert "operations dispatched per chunk" in out and "FLOPs per image" in out
    assert "chunks for 4 images: 1 of up to" in out


def test_the_boxes_are_random_resized_crops_inside_the_image() -> None:
    boxes = gpu_resize.random_boxes(np.random.default_rng(0), 200, 500, 375)
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= 500).all() and (boxes[:, 3] <= 375).all()
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / (500 * 375)
    assert area.min() > 0.05 and area.max() <= 1.0


@pytest.mark.parametrize("args", [["--size", "big"], ["--batch", "0"]])
def test_bad_arguments_are_usage_errors(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=script_env()
    )
    assert proc.returncode == 2 and "error" in proc.stderr
