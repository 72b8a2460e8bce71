"""``aioloader bench``: the command run as a user runs it (a subprocess, JSON on stdout and
the progress bar on stderr), the report, a user's own decode function, the comparison with
DataLoader, the Chrome trace, and ``--cache`` (epoch 1 filling a sample cache beside epoch 2
served from it); the pure track layout of the trace."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import decode_number, script_env

from aioloader import FileDataset, Loader
from aioloader.cli import main
from aioloader.cli.args import byte_size
from aioloader.cli.tune import IO_SWEEP, Setting, format_tune, tune, worker_sweep
from aioloader.config import usable_cpus
from aioloader.observe.bottleneck import VERDICTS
from aioloader.observe.trace import chrome_trace, lanes

STAGE_NAMES = set(VERDICTS)  # read, decode, collate, transfer, loop, trainer


def test_lanes_put_overlapping_events_on_separate_tracks() -> None:
    spans = [(0.0, 1.0), (0.5, 1.0), (1.0, 0.5), (1.2, 0.1), (3.0, 1.0)]
    tracks = lanes(spans)
    assert tracks == [0, 1, 0, 2, 0]  # at 1.2 both earlier tracks are busy until 1.5
    for i, (s1, d1) in enumerate(spans):  # no two events of one track overlap
        for j, (s2, d2) in enumerate(spans):
            if i < j and tracks[i] == tracks[j]:
                assert s1 + d1 <= s2 or s2 + d2 <= s1


def test_a_chrome_trace_names_a_track_per_lane_and_times_in_microseconds() -> None:
    events = [("read", 10.0, 0.002, 1), ("read", 10.001, 0.002, 1), ("decode", 10.003, 0.01, 16)]
    trace = chrome_trace(events)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"read 0", "read 1", "decode 0"}
    assert [(e["name"], e["ts"], e["dur"]) for e in spans] == [
        ("read", 0.0, 2000.0),
        ("read", 1000.0, 2000.0),
        ("decode", 3000.0, 10000.0),
    ]
    assert len({e["tid"] for e in spans}) == 3 and trace["displayTimeUnit"] == "ms"


def test_bench_json_on_stdout_progress_on_stderr_and_a_trace(image_folder: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aioloader",
            "bench",
            str(image_folder),
            "--seconds",
            "2",
            "--workers",
            "1",
            "--batch-size",
            "8",
            "--json",
            "--trace",
            str(trace),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=script_env(),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # stdout is one JSON object and nothing else
    assert result["samples_per_s"] > 0 and result["mb_per_s"] > 0 and result["min_step_ms"] > 0
    assert result["samples_per_s"] == pytest.approx(result["samples"] / result["seconds"], rel=0.01)
    assert result["min_step_ms"] == pytest.approx(8 / result["samples_per_s"] * 1e3, rel=0.01)
    files = [p for p in image_folder.rglob("*.jpg")]
    mean_bytes = sum(p.stat().st_size for p in files) / len(files)  # every file read about as often
    assert result["mb_per_s"] == pytest.approx(result["samples_per_s"] * mean_bytes / 1e6, rel=0.35)
    assert result["bottleneck"]["stage"] in STAGE_NAMES and result["bottleneck"]["advice"]
    assert set(result["stages"]) == {"read", "decode", "collate", "transfer", "loop"}
    assert result["stages"]["decode"]["items"] > 0
    assert "aioloader" in proc.stderr  # the progress bar
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["name"] for e in events if e["ph"] == "X"} == {"read", "decode", "collate", "transfer"}
    # The stages are traced where they run: with --trace, "auto" loads in this process.
    assert result["settings"]["loader_process"] == "auto" and result["settings"]["runtime"] == "thread"


def test_bench_decode_on_ray_reports_the_clusters_figures(image_folder: Path) -> None:
    """``--decode-on ray``: a cluster found or started (and then shut down) by bench; the
    cluster's figures in the JSON."""
    pytest.importorskip("ray")
    # 4 s after the first batch: Ray starts its worker processes as tasks come, and on 2 busy
    # cores the first of them took most of 2 s once (no sample counted after the first batch).
    argv = ["bench", str(image_folder), "--seconds", "4", "--batch-size", "8", "--decode-on", "ray", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "aioloader", *argv],
        capture_output=True,
        text=True,
        timeout=180,
        env=script_env(),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["settings"]["decode_on"] == "ray" and result["settings"]["runtime"] == "thread"
    cluster = result["cluster"]
    assert cluster["how"] in proc.stderr and cluster["cpus"] >= 1
    if cluster["started_by_bench"]:  # else another process's cluster was running: bench joined it
        assert cluster["how"].startswith("started a local Ray cluster of ")
    assert cluster["tasks"] > 0 and cluster["samples"] >= result["samples"] > 0
    assert 0 < cluster["busy_share"] <= 1 and cluster["decode_ms_per_sample"] > 0


def users_decode(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mydecode:number`` importable from the current directory, ``folder``."""
    (folder / "mydecode.py").write_text(
        "import numpy as np\n\ndef number(data):\n    return np.array([int(data.rsplit(b'-', 1)[1])])\n"
    )
    monkeypatch.chdir(folder)


def test_bench_report_with_a_users_decode_and_torch_compared(
    numbered: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flat folder of files and ``--decode module:function`` from the current directory."""
    users_decode(tmp_path, monkeypatch)
    folder = str(Path(numbered[0]).parent)
    code = main(
        [
            "bench",
            folder,
            "--decode",
            "mydecode:number",
            "--seconds",
            "1",
            "--workers",
            "1",
            "--batch-size",
            "4",
            "--compare",
            "torch",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"aioloader bench {folder}: 37 files" in out
    assert "samples/s" in out and "bottleneck: " in out and "train step of" in out
    assert "torch.utils.data.DataLoader(num_workers=1):" in out and "aioloader " in out
    for stage in ("read", "decode", "collate", "transfer", "loop"):
        assert f"\n  {stage} " in out


def test_bench_names_a_file_that_does_not_decode(
    numbered: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(Path(numbered[0]).parent)  # text files, not images
    assert main(["bench", folder, "--decode", "image:32", "--seconds", "1", "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert "aioloader bench: loading failed: " in err and "f000" in err
    assert "cannot identify image file (" in err and " object at 0x" not in err
    assert err.count("--- worker traceback ---") == 1
    assert "pass --on-error skip" in err.strip().splitlines()[-1]


def test_bench_on_error_skip_gets_past_a_bad_file(
    image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aioloader")
    root = tmp_path / "train"
    shutil.copytree(image_folder, root)
    bad = root / sorted(p.name for p in root.iterdir() if p.is_dir())[0] / "broken.jpg"
    bad.write_bytes(b"not a jpeg")
    argv = [
        "bench",
        str(root),
        "--decode",
        "image:32",
        "--seconds",
        "1",
        "--workers",
        "1",
        "--batch-size",
        "8",
    ]
    assert main([*argv, "--on-error", "skip", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["on_error"] == "skip" and report["failures"]["DecodeError"] >= 1
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped ")]
    assert len(warned) == 1 and repr(str(bad)) in warned[0] and "\n" not in warned[0]
    assert main([*argv, "--on-error", "skip"]) == 0  # the text report says what was skipped
    assert "skipped (--on-error skip): " in capsys.readouterr().out


def test_bench_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` shows a description written for a terminal, not the module's reST."""
    with pytest.raises(SystemExit) as info:
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "the bottleneck with its advice" in " ".join(out.split())
    assert "``" not in out and ":mod:" not in out and "`" not in out, out


def test_bench_refuses_what_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(tmp_path / "nowhere")]) == 2
    assert "is not a folder or a URL prefix" in capsys.readouterr().err
    assert main(["bench", str(tmp_path), "--decode", "nosuchmodule:fn"]) == 2
    assert "No module named 'nosuchmodule'" in capsys.readouterr().err
    assert main(["bench", str(tmp_path), "--decode", "image:big"]) == 2
    assert "the size after 'image:' must be an integer" in capsys.readouterr().err


def test_bench_tune_sweeps_both_settings_and_reports_what_auto_chose(
    numbered: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    users_decode(tmp_path, monkeypatch)
    folder = str(Path(numbered[0]).parent)
    argv = ["bench", folder, "--decode", "mydecode:number", "--seconds", "0.5", "--batch-size", "4"]
    assert main([*argv, "--tune", "--tune-seconds", "0.3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    tuned = result["tune"]
    usable = usable_cpus()
    rows = [(t["io_concurrency"], t["num_workers"]) for t in tuned["trials"]]
    expected = [("auto", "auto")] + [(io, usable) for io in IO_SWEEP]
    best_io = max(IO_SWEEP, key=lambda io: tuned["trials"][rows.index((io, usable))]["samples_per_s"])
    expected += [(best_io, w) for w in worker_sweep(usable) if w != usable]
    assert rows == expected
    assert all(t["samples_per_s"] > 0 for t in tuned["trials"])
    fixed = [t for t in tuned["trials"] if t["io_concurrency"] != "auto"]
    assert tuned["best"] == max(fixed, key=lambda t: t["samples_per_s"])
    io, workers = tuned["auto"]["chose"]
    assert 1 <= io <= 1024 and 1 <= workers <= usable
    assert tuned["auto_vs_best"] == pytest.approx(
        tuned["auto"]["samples_per_s"] / tuned["best"]["samples_per_s"], abs=0.002
    )
    # the main run was on "auto" too: the settings say what it asked for and where it ended
    assert result["settings"]["io_concurrency_asked"] == "auto"
    assert isinstance(result["settings"]["io_concurrency"], int)
    assert result["settings"]["loader_process"] == "auto" and result["settings"]["runtime"] == "process"
    assert main([*argv, "--tune", "--tune-seconds", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "best fixed: io_concurrency=" in out and "auto chose io_concurrency=" in out


class SlowStart:
    """Decode numbered files; each process's first decode sleeps ``seconds`` first: a loader
    whose first batch takes longer than a setting of a short sweep."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = False

    def __call__(self, data: bytes) -> np.ndarray:
        if not self.started:
            self.started = True
            time.sleep(self.seconds)
        return decode_number(data)


def test_tune_runs_each_setting_for_its_seconds_after_its_first_batch(numbered: list[str]) -> None:
    """As the report's header says ("N s per setting after its first batch"): a first batch
    that takes longer than N s (start-up, which the sweep does not compare) still leaves the
    setting its N s, and a rate."""
    ds = FileDataset(numbered)

    def make(io: Setting, workers: Setting) -> Loader:
        return Loader(ds, batch_size=4, decode=SlowStart(0.6), io_concurrency=io, num_workers=workers)

    tuned = tune(make, 1, 0.3, ios=(8,))
    assert [(t["io_concurrency"], t["num_workers"]) for t in tuned["trials"]] == [("auto", "auto"), (8, 1)]
    assert all(t["samples_per_s"] > 0 for t in tuned["trials"]), tuned["trials"]
    assert format_tune(tuned)[0] == "  tuning (0.3 s per setting after its first batch, median of 1):"


def test_worker_sweep() -> None:
    assert worker_sweep(1) == [1]
    assert worker_sweep(2) == [1, 2]
    assert worker_sweep(12) == [1, 2, 4, 8, 11, 12]


def test_bench_refuses_a_setting_that_is_neither_a_number_nor_auto(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["bench", str(tmp_path), "--io-concurrency", "many"])
    assert "'many' is not a positive integer or 'auto'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", str(tmp_path), "--loader-process", "maybe"])
    assert "'maybe' is not 'auto', 'true' or 'false'" in capsys.readouterr().err
    (tmp_path / "a.txt").write_text("1")
    assert (
        main(["bench", str(tmp_path), "--loader-process", "true", "--trace", str(tmp_path / "t.json")]) == 2
    )
    assert (
        "--trace records the stages in this process: --loader-process auto or false"
        in capsys.readouterr().err
    )


def test_bench_cache_prints_epoch_one_filling_beside_epoch_two_served(image_folder: Path) -> None:
    """``--cache memory``: two whole epochs, the first filling the cache, the second served
    from it (every sample a hit), side by side; the loader's progress bars say "epoch 1" and
    "epoch 2" as the report does; ``--json`` gives the same figures as keys."""
    argv = ["bench", str(image_folder), "--cache", "memory", "--workers", "1", "--batch-size", "8"]
    proc = subprocess.run(
        [sys.executable, "-m", "aioloader", *argv, "--max-side", "48"],
        capture_output=True,
        text=True,
        timeout=120,
        env=script_env(),
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"aioloader bench {image_folder} --cache: 30 files" in out, out
    assert "cache in memory" in out and "max_side 48" in out
    assert re.search(r"epoch 1 \(filling\) +\d+ +[\d.]+ +0 +30 ", out), out
    assert re.search(r"epoch 2 \(served\) +\d+ +[\d.]+ +30 +0 ", out), out
    assert "epoch 2 / epoch 1: " in out and "(30 hits in epoch 2, " in out
    assert "cache 100%" in proc.stderr  # the loader's own bar, epoch 2's
    assert set(re.findall(r"epoch \d+(?=:)", proc.stderr)) == {"epoch 1", "epoch 2"}, proc.stderr

    proc = subprocess.run(
        [sys.executable, "-m", "aioloader", *argv, "--json", "--cache-max-bytes", "1M"],
        capture_output=True,
        text=True,
        timeout=120,
        env=script_env(),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    one, two = result["epoch1"], result["epoch2"]
    assert (one["epoch"], one["role"], two["epoch"], two["role"]) == (1, "filling", 2, "served")
    assert (one["hits"], one["misses"], one["stored"]) == (0, 30, 30)
    assert (two["hits"], two["misses"], two["stored"]) == (30, 0, 0)
    assert one["samples"] == two["samples"] == 30 and one["samples_per_s"] > 0 and two["samples_per_s"] > 0
    assert result["ratio"] == pytest.approx(two["samples_per_s"] / one["samples_per_s"], rel=0.01)
    held = sum(p.stat().st_size for p in image_folder.rglob("*.jpg"))  # no max_side: the files as they are
    assert result["hits"] == 30 and result["bytes_held"] == two["bytes_held"] == one["bytes_held"] == held
    assert result["cache"]["kind"] == "memory" and result["cache"]["max_bytes"] == 1 << 20


def test_bench_cache_options_need_the_cache_and_a_whole_epoch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.txt").write_text("1")
    assert main(["bench", str(tmp_path), "--max-side", "64"]) == 2
    assert "--max-side and --cache-max-bytes go with --cache memory|DIR" in capsys.readouterr().err
    assert main(["bench", str(tmp_path), "--cache", "memory", "--tune"]) == 2
    assert "--cache runs two whole epochs: it cannot go with --tune" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", str(tmp_path), "--cache", "memory", "--cache-max-bytes", "lots"])
    assert "'lots' is not a number of bytes" in capsys.readouterr().err
    assert byte_size("512M") == 512 << 20 and byte_size("2GiB") == 2 << 30 and byte_size("1000") == 1000
