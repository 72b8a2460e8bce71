"""``benchmarks/gpu_train.py``: it skips cleanly where there is no GPU (CI), its pure helpers
(per-thread CPU from ``/proc``, the steady rate, the table), and the whole run on the CPU
with a stand-in model, for the logic a GPU machine would run."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import load_benchmark, script_env

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCHMARKS / "gpu_train.py"


gpu_train = load_benchmark("gpu_train")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here: the benchmark would run, not skip")
def test_quick_run_skips_cleanly_without_cuda() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        env=script_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "gpu_train: skipped: no CUDA device"


def test_bad_arguments_are_usage_errors() -> None:
    for argv in (
        ["--variants", "dataloader,nope"],
        ["--images", "100", "--batch", "256"],
        ["--classes", "1001"],
    ):
        with pytest.raises(SystemExit) as e:
            gpu_train.parse_args(argv)
        assert e.value.code == 2


def test_quick_sets_the_small_defaults_and_leaves_explicit_values() -> None:
    args = gpu_train.parse_args(["--quick", "--epochs", "4"])
    assert (args.images, args.epochs, args.rounds) == (512, 4, 1)
    args = gpu_train.parse_args(["--variants", "aioloader-gpu,dataloader,aioloader-gpu"])
    assert (args.images, args.epochs, args.rounds, args.batch) == (6000, 3, 2, 256)
    assert args.variants == ["aioloader-gpu", "dataloader"] and args.models == ["resnet18", "resnet50"]


def test_thread_cpu_names_a_burning_thread_of_this_process() -> None:
    burnt, release = threading.Event(), threading.Event()

    def burn() -> None:
        start = time.thread_time()
        x = 0
        while time.thread_time() - start < 0.3:  # CPU time, however busy the machine
            x += 1
        burnt.set()
        release.wait(30)

    before = gpu_train.thread_cpu()
    cpu0 = gpu_train.process_cpu()
    thread = threading.Thread(target=burn, name="burner-7", daemon=True)
    thread.start()
    try:
        assert burnt.wait(60)
        names = gpu_train.python_thread_names()
        after = gpu_train.thread_cpu()
        cpu1 = gpu_train.process_cpu()
    finally:
        release.set()
        thread.join(30)
    assert thread.native_id in after and thread.native_id not in before
    assert after[threading.main_thread().native_id][1] >= 0
    by_group = gpu_train.thread_cpu_delta(before, after, names, "python", cpu1 - cpu0)
    assert by_group["burner"] * 1e3 > 0
    assert "burner-7" not in by_group  # grouped without its number


def test_thread_groups() -> None:
    group = gpu_train.thread_group
    assert group("python", "MainThread", "python") == "MainThread"
    assert group("python", "aioloader-transfer", "python") == "aioloader-transfer"
    assert group("python", "Thread-12 (_pin_memory_loop)", "python") == "Thread (_pin_memory_loop)"
    assert group("pt_autograd_0", None, "python") == "pt_autograd"
    assert group("python", None, "python") == gpu_train.UNNAMED  # the intra-op pool
    assert group("python3.11", None, "python3.11") == gpu_train.UNNAMED
    assert group("cuda-EvtHandlr", None, "python") == "cuda-EvtHandlr"


def test_thread_cpu_delta_by_group_counts_new_threads_from_zero_and_the_exited_rest() -> None:
    before = {1: ("python", 5.0), 2: ("pt_autograd_0", 1.0), 3: ("python", 2.0), 9: ("gone", 1.0)}
    after = {1: ("python", 5.5), 2: ("pt_autograd_0", 1.25), 3: ("python", 2.5), 4: ("python", 0.25)}
    names = {1: "MainThread", 4: "aioloader-transfer"}
    out = gpu_train.thread_cpu_delta(before, after, names, "python", process_delta=1.5)
    assert out == {"MainThread": 0.5, "pt_autograd": 0.25, gpu_train.UNNAMED: 0.5, "aioloader-transfer": 0.25}
    out = gpu_train.thread_cpu_delta(before, after, names, "python", process_delta=3.0)
    assert out[gpu_train.EXITED] == 1.5
    assert gpu_train.thread_cpu_delta(before, after, names, "python") == {
        "MainThread": 0.5,
        "pt_autograd": 0.25,
        gpu_train.UNNAMED: 0.5,
        "aioloader-transfer": 0.25,
    }


def test_stat_cpu_seconds_reads_utime_and_stime_past_a_comm_with_spaces() -> None:
    tick = gpu_train._TICK
    stat = f"42 (a (weird) name) S 1 42 42 0 -1 4194304 100 0 0 0 {3 * tick} {tick} 0 0 20 0 1 0"
    assert gpu_train.stat_cpu_seconds(stat) == 4.0


def test_steady_rate_leaves_out_the_first_epoch() -> None:
    rate = gpu_train.steady_rate
    assert rate([(5888, 10.0), (5888, 2.0), (5888, 2.0)]) == 5888 * 2 / 4.0
    assert rate([(512, 5.0), (512, 0.5)]) == 1024.0
    assert rate([(512, 4.0)]) == 128.0  # one epoch: that one
    assert math.isnan(rate([])) and math.isnan(rate([(10, 1.0), (0, 0.0)]))
    assert rate([(100, 9.0), (100, 1.0), (300, 1.0)], skip=2) == 300.0


def test_ratio_median_and_fmt_with_missing_values() -> None:
    nan = float("nan")
    assert gpu_train.ratio(3.0, 2.0) == 1.5
    assert all(math.isnan(gpu_train.ratio(a, b)) for a, b in [(1.0, 0.0), (nan, 1.0), (1.0, None)])
    assert gpu_train.median([3.0, nan, 1.0]) == 2.0 and math.isnan(gpu_train.median([nan]))
    assert gpu_train.fmt(1234.4) == "1234" and gpu_train.fmt(0.456, ".0%") == "46%"
    assert (
        gpu_train.fmt(1.234, ".2f", "x") == "1.23x"
        and gpu_train.fmt(nan) == "-"
        and gpu_train.fmt(None) == "-"
    )


def test_markdown_table() -> None:
    text = gpu_train.markdown_table(
        ["loader", "img/s", "note"], [["dataloader", "3500", "a|b"], ["x", "1", ""]]
    )
    assert text.splitlines() == [
        "| loader | img/s | note |",
        "| --- | ---: | ---: |",
        "| dataloader | 3500 | a\\|b |",
        "| x | 1 |  |",
    ]
    with pytest.raises(ValueError):
        gpu_train.markdown_table(["a", "b"], [["1"]])


def test_threads_cell_and_device_decode_cells() -> None:
    cell = gpu_train.threads_cell({"MainThread": 0.5, "pt_autograd": 0.25, "tiny": 0.00001}, batches=10)
    assert cell == "MainThread 50.0, pt_autograd 25.0"
    many = {f"t{i}": 0.001 * (i + 1) for i in range(8)}
    assert gpu_train.threads_cell(many, batches=1, top=2) == "t7 8.0, t6 7.0, other 21.0"
    assert gpu_train.threads_cell({}, batches=0) == "-"
    assert gpu_train.device_decode_counts(SimpleNamespace()) is None
    stats = SimpleNamespace(device_decode=SimpleNamespace(gpu=750, cpu=250, fallbacks=3, gpu_seconds=0.75))
    counts = gpu_train.device_decode_counts(stats)
    assert counts == {"gpu": 750.0, "cpu": 250.0, "fallbacks": 3.0, "gpu_seconds": 0.75}
    assert gpu_train.decode_share_cell(counts) == "GPU 75% / CPU 25%, 3 fallbacks, 1.00 ms GPU/sample"
    partial = gpu_train.device_decode_counts(SimpleNamespace(device_decode=SimpleNamespace(gpu=10, cpu=0)))
    assert partial is not None and gpu_train.decode_share_cell(partial) == "GPU 100% / CPU 0%"
    assert gpu_train.decode_share_cell(None) == "-"


def test_parse_utilization_reads_nvidia_smis_lines() -> None:
    parse = gpu_train.parse_utilization
    assert parse("87\n") == 87.0 and parse(" 5 ") == 5.0 and parse("87 %") == 87.0 and parse("0") == 0.0
    for line in ("[N/A]", "[Not Supported]", "", "No devices were found", "101", "-1", "nan"):
        assert parse(line) is None, line


def test_mean_since_util_cell_and_smi_id() -> None:
    samples = [(1.0, 10.0), (2.0, 50.0), (3.0, 70.0)]
    assert gpu_train.mean_since(samples, 2.0) == 60.0
    assert gpu_train.mean_since(samples, 9.0) == 130.0 / 3  # none since: all of them
    assert math.isnan(gpu_train.mean_since([], 0.0))
    nan = float("nan")
    assert gpu_train.util_cell([50.0, nan, 70.0]) == "60%" and gpu_train.util_cell([nan]) == "n/a"
    assert gpu_train.util_cell([]) == "n/a"
    assert gpu_train.smi_id(SimpleNamespace(uuid="6c1b-77"), 1) == "GPU-6c1b-77"
    assert gpu_train.smi_id(SimpleNamespace(uuid="GPU-6c1b"), 1) == "GPU-6c1b"
    assert gpu_train.smi_id(SimpleNamespace(uuid="MIG-ab"), 1) == "MIG-ab"
    assert gpu_train.smi_id(SimpleNamespace(total_memory=0), 3) == "3"


def wait_for_samples(sampler: object, n: int) -> None:
    """Until ``sampler`` holds ``n`` samples (a generous bound for a loaded machine)."""
    deadline = time.monotonic() + 60
    while len(sampler.samples) < n and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)


def test_gpu_util_polls_its_query_on_a_thread_and_skips_failed_readings() -> None:
    readings = iter(["30", "[N/A]", RuntimeError("NVML gone"), 50.0])

    def query() -> object:
        value = next(readings, 50.0)
        if isinstance(value, Exception):
            raise value
        return value

    sampler = gpu_train.GpuUtil(query=query, interval=0.001).start()
    try:
        wait_for_samples(sampler, 3)
        names = gpu_train.python_thread_names().values()
        assert "gpu-util" in names
        assert sampler.child_cpu() == 0.0
    finally:
        samples = sampler.stop()
    values = [v for _, v in samples]
    assert values[:2] == [30.0, 50.0] and set(values) == {30.0, 50.0}
    assert "gpu-util" not in gpu_train.python_thread_names().values()
    with pytest.raises(ValueError):
        gpu_train.GpuUtil()
    with pytest.raises(ValueError):
        gpu_train.GpuUtil(command=["x"], query=lambda: 1.0)


def test_gpu_util_reads_a_sampling_process_and_ends_it() -> None:
    """The nvidia-smi loop's way: a process printing a reading a line, ended on stop."""
    script = "import sys, time\nfor x in ('12', '[N/A]', '40 %'):\n    print(x, flush=True)\ntime.sleep(60)\n"
    sampler = gpu_train.GpuUtil(command=[sys.executable, "-c", script]).start()
    try:
        wait_for_samples(sampler, 2)
        assert sampler.child_cpu() >= 0.0
    finally:
        samples = sampler.stop()
    assert [v for _, v in samples] == [12.0, 40.0]
    assert sampler._proc is not None and sampler._proc.poll() is not None  # ended, reaped
    assert sampler.child_cpu() == 0.0  # gone


def test_gpu_util_sampler_chooses_a_working_source_or_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_nvml(device: str, library: str = "") -> object:
        raise OSError(f"libnvidia-ml.so.1: cannot open ({device})")

    monkeypatch.setattr(gpu_train, "nvml_query", no_nvml)
    monkeypatch.setattr(gpu_train.shutil, "which", lambda name: None)

    def no_pynvml(index: int) -> int:
        raise ModuleNotFoundError("No module named 'pynvml'")

    cuda = SimpleNamespace(
        get_device_properties=lambda i: SimpleNamespace(uuid="ab-12"), utilization=no_pynvml
    )
    make, why = gpu_train.gpu_util_sampler(SimpleNamespace(cuda=cuda), 0)
    assert make is None
    assert why == (
        "NVML (ctypes), GPU-ab-12: OSError: libnvidia-ml.so.1: cannot open (GPU-ab-12); "
        "torch.cuda.utilization: ModuleNotFoundError: No module named 'pynvml'; no nvidia-smi"
    )
    cuda.utilization = lambda index: 42
    make, how = gpu_train.gpu_util_sampler(SimpleNamespace(cuda=cuda), 0, interval_ms=5)
    assert make is not None and how == "torch.cuda.utilization, every 5 ms"
    sampler = make()
    assert sampler.query is not None and sampler.query() == 42.0 and sampler.interval == 0.005


def test_nvml_query_without_the_library_is_an_oserror() -> None:
    with pytest.raises(OSError):
        gpu_train.nvml_query("GPU-0", library="libnvidia-ml-not-here.so.1")


def test_measure_keeps_the_steady_epochs_utilization_and_stops_the_sampler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Epoch 1 reads 10%, epochs 2.. 90%: the mean is the steady epochs' alone; the sampler
    has ended once ``measure`` returns."""
    monkeypatch.setattr(gpu_train, "DEVICE", "cpu")
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # userfns.tree_cpu
    steady = threading.Event()
    made: list[object] = []

    def util() -> object:
        sampler = gpu_train.GpuUtil(query=lambda: 90.0 if steady.is_set() else 10.0, interval=0.001)
        made.append(sampler)
        return sampler

    def count(value: float) -> int:
        return sum(1 for _, v in made[0].samples if v == value)  # type: ignore[attr-defined]

    def until(cond: object) -> None:
        deadline = time.monotonic() + 60
        while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
            time.sleep(0.005)

    calls = []

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        calls.append(len(labels))
        if len(calls) == 1:
            until(lambda: count(10.0) >= 1)
        if len(calls) == 2:  # the last batch of epoch 1
            steady.set()
        if len(calls) == 3:  # epoch 2 under way: two readings of it
            n = count(90.0)
            until(lambda: count(90.0) >= n + 2)

    batches = [(torch.zeros(4, 3, 2, 2), torch.zeros(4, dtype=torch.int64))] * 2
    trainer = SimpleNamespace(torch=torch, device=torch.device("cpu"), step=step)
    res = gpu_train.measure(lambda: batches, trainer, epochs=2, to_device=False, util=util)
    assert len(calls) == 4 and res.batches == 4 and len(made) == 1
    assert count(10.0) >= 1 and res.gpu_util == 90.0
    assert "gpu-util" not in gpu_train.python_thread_names().values()
    res = gpu_train.measure(lambda: batches, trainer, epochs=1, to_device=False)
    assert math.isnan(res.gpu_util)


DRY_RUN = """
import sys, types, warnings
import torch
sys.path.insert(0, {benchmarks!r})
import gpu_train

# The logic of a GPU run on the CPU: a stand-in for torchvision's model, CUDA's queries faked.
gpu_train.DEVICE = "cpu"
torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = lambda *a: "stand-in (CPU)"
torch.cuda.get_device_properties = lambda *a: types.SimpleNamespace(total_memory=0)
warnings.filterwarnings("ignore")  # pin_memory=True without an accelerator
tv = types.ModuleType("torchvision")
tv.__version__ = "stand-in"


def tiny(weights=None, num_classes=1000):
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 8, stride=8), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(4, num_classes),
    )


tv.models = types.SimpleNamespace(resnet18=tiny)
sys.modules["torchvision"] = tv
sys.exit(gpu_train.main(sys.argv[1:]))
"""


def test_a_whole_run_on_the_cpu_with_a_stand_in_model(tmp_path: Path) -> None:
    driver = tmp_path / "dry.py"
    driver.write_text(textwrap.dedent(DRY_RUN).format(benchmarks=str(BENCHMARKS)))
    argv = ["--models", "resnet18", "--images", "32", "--classes", "4", "--batch", "8", "--epochs", "2"]
    argv += ["--rounds", "1", "--gpu-steps", "1", "--decode-seconds", "0.2", "--root", str(tmp_path / "data")]
    argv += ["--variants", "dataloader,aioloader-cpu"]
    proc = subprocess.run(
        [sys.executable, str(driver), *argv], capture_output=True, text=True, timeout=110, env=script_env()
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "# data: 32 JPEGs" in out and len(list((tmp_path / "data").glob("class_000*/*.jpg"))) == 32
    assert "## gpu_train: resnet18 on stand-in (CPU)" in out and "### resnet18" in out
    main_table = out.split("### resnet18", 1)[1].split("trainer-process CPU ms per batch by thread", 1)[0]
    rows = {
        line.split(" | ")[0][2:]: line.split(" | ")
        for line in main_table.splitlines()
        if line.startswith("| ")
    }
    assert rows["dataloader"][3] == "1.00x"  # the peer against itself
    assert rows["aioloader-cpu"][3].endswith("x") and rows["aioloader-cpu"][-1] == "CPU |"
    assert any(name.startswith("decode-limit, user fn: ") for name in rows)
    assert not any(name.startswith("decode-limit, ImageDecoder") for name in rows)  # not asked for
    assert "gpu-limit (batch on the GPU)" in rows
    assert "MainThread" in out  # the trainer's CPU by thread
    headers = main_table.split("| loader | ", 1)[1].split(" |\n", 1)[0].split(" | ")
    util = headers.index("GPU util") + 1
    assert rows["dataloader"][util] == rows["aioloader-cpu"][util] == "n/a"  # not sampled on the CPU
    assert rows["gpu-limit (batch on the GPU)"][util] == "n/a"
    assert "# GPU utilization: n/a: not sampled: the device is cpu" in out
    assert "- GPU utilization (mean over epochs 2..2, medians of the rounds): not sampled" in out
