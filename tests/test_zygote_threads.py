"""The zygote and a multi-threaded trainer, in the orders of calls users write: torch
imported, a model built, a forward pass run (PyTorch's intra-op threads), a Python thread
started, a Jupyter kernel (its threads), a CUDA context. The zygote is forked past threads
of the kinds :mod:`aioloader.procs.forksafe` shows safe, and otherwise started as a fresh
interpreter that preloads what the helpers import. Scripts run in their own session; what
they leave behind is found with pgrep."""

from __future__ import annotations

import _thread
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import KERNEL_SPEC, finish_script, process_name, session_survivors, start_script

from aioloader.procs import cleanstart, forksafe, zygote

TRAIN = """
import _thread, json, os, sys, threading
import torch

def tasks():
    return len(os.listdir("/proc/self/task"))

order = {order!r}
if order in ("model", "forward", "unknown-thread", "python-thread"):
    torch.set_num_threads(2)  # PyTorch's pthreadpool: one thread beside the caller
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
if order in ("forward", "unknown-thread", "python-thread"):
    model(torch.randn(64, 512))
    torch.ones(4_000_000).add_(1)  # a parallel op: PyTorch's OpenMP pool runs its thread
if order == "unknown-thread":  # a thread no census knows (not in threading.enumerate())
    _thread.start_new_thread(threading.Event().wait, ())
if order == "python-thread":
    threading.Thread(target=threading.Event().wait, daemon=True, name="server").start()
if order == "openblas-stopped":
    # numpy's OpenBLAS pool ran, then a fork stopped its threads (OpenBLAS's own handler):
    # its pool's size still reads 2, its threads are gone, and a thread no census knows runs.
    import numpy as np
    np.ones((256, 256)) @ np.ones((256, 256))
    if os.fork() == 0:
        os._exit(0)
    os.wait()
    _thread.start_new_thread(threading.Event().wait, ())
threads = tasks()

# The guard: the trainer never forks past a Python thread, nor past more OS threads than
# PyTorch's two intra-op pools can hold (each ``torch.get_num_threads() - 1``; OpenBLAS's
# are stopped for any fork): a lock held by any other thread would be copied held.
_fork = os.fork
def checked_fork():
    allowed = 1 + 2 * (torch.get_num_threads() - 1)
    assert threading.active_count() == 1, f"os.fork() past Python threads: {{threading.enumerate()}}"
    assert order != "unknown-thread", "os.fork() past a thread of an unknown kind"
    assert tasks() <= allowed, f"os.fork() in a process with {{tasks()}} OS threads (at most {{allowed}})"
    return _fork()
os.fork = checked_fork

import aioloader
from aioloader.procs import zygote

def openmp_threads():
    import threadpoolctl, torch
    limits = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "openmp"]
    return [torch.get_num_threads(), *limits]

if __name__ == "__main__":
    ds = aioloader.FileDataset.from_folder({folder!r})
    with aioloader.Loader(ds, batch_size=8, decode=aioloader.ImageDecoder(32), shuffle=False) as loader:
        labels = []
        for images, y in loader:
            assert tuple(images.shape) == (len(y), 3, 32, 32) and images.dtype == torch.uint8, images.shape
            labels += y.tolist()
        assert labels == ds.labels.tolist(), labels
        assert loader.runtime == "process", loader.runtime
    # Whatever the zygote forks runs one thread in torch and in every OpenMP runtime, and a
    # parallel-sized op there finishes (a helper waiting for a pool thread the fork did not
    # copy would hang, and the test's timeout would end it).
    def helper_threads(data):
        import torch
        torch.ones(4_000_000).add_(1)
        return np.array(openmp_threads())
    import numpy as np
    with aioloader.Loader(ds.paths[:4], batch_size=4, decode=helper_threads) as loader:
        helper = next(iter(loader)).tolist()
    zpid = zygote.pid()
    with open(f"/proc/{{zpid}}/comm") as f:
        comm = f.read().strip()
    zygote_tasks = len(os.listdir(f"/proc/{{zpid}}/task"))
    print(json.dumps([zygote.started_by(), threads, comm, zygote_tasks, helper]), flush=True)
"""


def test_how_to_start_forks_only_past_threads_of_known_kinds() -> None:
    c = forksafe.Census
    assert forksafe.how_to_start(c(1, 1)) == "fork"
    assert forksafe.how_to_start(c(2, 1)) == "spawn"  # a native thread of no known kind
    assert forksafe.how_to_start(c(3, 2)) == "spawn"  # a Python thread
    # A forward pass on 2 threads: OpenMP's pool and PyTorch's pthreadpool, one thread each.
    assert forksafe.how_to_start(c(3, 1, openmp_pool=1, torch_pool=1)) == "fork"
    assert forksafe.how_to_start(c(4, 1, openmp_pool=1, torch_pool=1)) == "spawn"  # and one more
    # CUDA: the driver's threads, by name.
    assert forksafe.how_to_start(c(4, 1, openmp_pool=1, named_threads=2, cuda=True)) == "fork"
    assert forksafe.how_to_start(c(1, 1, cuda=True)) == "fork"  # counted: the context made no thread
    # A Jupyter kernel's: 7 Python threads, 4 of libzmq's; a user's thread there is another.
    assert forksafe.how_to_start(c(12, 8, kernel_threads=7, named_threads=4)) == "fork"
    assert forksafe.how_to_start(c(13, 9, kernel_threads=7, named_threads=4)) == "spawn"
    # Where OS threads cannot be counted: Python's own threads and torch's CUDA context.
    assert forksafe.how_to_start(c(None, 1)) == "fork"
    assert forksafe.how_to_start(c(None, 2)) == "spawn"
    assert forksafe.how_to_start(c(None, 1, cuda=True)) == "spawn"
    assert c(5, 1, openmp_pool=9).unknown == 0 and c(5, 1, openmp_pool=1).unknown == 3


def test_the_census_counts_every_thread_of_this_process() -> None:
    """pytest's process, whose other threads are of no kernel: a thread started with
    ``_thread`` (not in ``threading.enumerate()``) is counted as an OS thread, not a Python one."""
    before = forksafe.census()
    assert before.os_threads == len(os.listdir("/proc/self/task"))
    assert (before.python_threads, before.kernel_threads) == (threading.active_count(), 0)
    stop, started = threading.Event(), threading.Event()
    _thread.start_new_thread(lambda: (started.set(), stop.wait()), ())
    try:
        assert started.wait(10)
        during = forksafe.census()
        assert during.os_threads == before.os_threads + 1
        assert during.python_threads == before.python_threads
    finally:
        stop.set()


def test_a_copy_forked_past_a_kernel_writes_to_streams_of_its_own() -> None:
    """After :func:`forksafe.after_fork` past a kernel's threads, ``sys.stdout`` and
    ``sys.stderr`` are new files on descriptors 1 and 2 (no lock of the kernel's stream
    objects), and OpenMP runs one thread."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            old = sys.stdout
            os.dup2(w, 1)
            forksafe.after_fork(forksafe.Census(9, 8, kernel_threads=7))
            from threadpoolctl import threadpool_info

            omp = {p["num_threads"] for p in threadpool_info() if p["user_api"] == "openmp"}
            print(sys.stdout is not old, sys.stdout.fileno(), sys.stderr.fileno(), omp == {1}, flush=True)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        said = f.read().split()
    assert os.waitpid(pid, 0)[1] == 0
    assert said == ["True", "1", "2", "True"], said


def test_the_clean_zygote_preloads_the_helpers_imports_and_torch_when_imported() -> None:
    modules = cleanstart.preloads()
    for name in ("aioloader.run.loaderproc", "aioloader.decode.worker", "numpy", "PIL.Image", "torch"):
        assert name in modules
    assert "torch" in sys.modules  # conftest imports it: the trainer has it, so the zygote does


def _uses_numpy(data: bytes) -> object:
    return np.frombuffer(data, dtype=np.uint8).sum()


class _Callable:
    def __call__(self, data: bytes) -> object:
        return data


def test_a_clean_zygote_also_imports_what_the_loaders_callables_need() -> None:
    """Their own module (a callable object's class's), and the modules their code names,
    never ``__main__`` (sent by value): imported once in the zygote, not in every worker."""
    found = cleanstart.modules_of(_uses_numpy, _Callable(), None, len)
    assert found[0] == __name__ and "numpy" in found
    assert found.count(__name__) == 1 and "builtins" not in found
    assert cleanstart.preloads(["numpy", "json"])[-1] == "json"  # once each, helpers' first


def test_this_process_started_its_zygote_as_the_rule_says() -> None:
    """pytest's process has imported torch and numpy (OpenBLAS's threads) before conftest
    started the zygote: forked where OpenBLAS's were its only other threads."""
    zpid = zygote.pid()
    assert zpid is not None and zygote.started_by() in ("fork", "spawn")
    deadline = time.monotonic() + 60  # a hang guard: it names itself once its interpreter runs
    while process_name(zpid) != "aioloader-fork":
        assert time.monotonic() < deadline, process_name(zpid)
        time.sleep(0.01)
    assert len(list(Path(f"/proc/{zpid}/task").iterdir())) == 1


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("order", "env", "started"),
    [
        ("import", {"OPENBLAS_NUM_THREADS": "1"}, "fork"),  # numpy starts no pool
        ("import", {"OPENBLAS_NUM_THREADS": "2"}, "fork"),  # OpenBLAS's pool, stopped for the fork
        ("model", {}, "fork"),  # PyTorch's pthreadpool made by set_num_threads
        ("forward", {}, "fork"),  # and its OpenMP pool's thread
        ("python-thread", {}, "spawn"),
        ("unknown-thread", {}, "spawn"),
        # One torch thread, so no pool of torch's can account for the thread of no known kind.
        ("openblas-stopped", {"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}, "spawn"),
    ],
    ids=[
        "single-threaded",
        "openblas-threads",
        "model",
        "forward-pass",
        "python-thread",
        "unknown-thread",
        "openblas-stopped",
    ],
)
def test_the_zygote_forks_only_past_threads_safe_to_fork_past(
    image_folder: Path, tmp_path: Path, order: str, env: dict[str, str], started: str
) -> None:
    """A trainer in each order of calls (run with ``-W error::DeprecationWarning``, Python
    3.12's fork warning an error, and any ``os.fork()`` past a thread of another kind an
    error) loads an epoch of JPEGs in a loader process; the zygote is forked or started
    clean as the rule says, named ``aioloader-fork``, single-threaded, and what it forks
    runs one torch and OpenMP thread and finishes a parallel-sized op."""
    script = TRAIN.format(order=order, folder=str(image_folder))
    args = ["-W", "error::DeprecationWarning", "train.py"]
    proc = start_script(tmp_path / "train.py", script, args=args, cwd=tmp_path, env=env)
    out, err = finish_script(proc, timeout=150)
    assert proc.returncode == 0, err
    how, threads, comm, zygote_tasks, helper = json.loads(out.splitlines()[-1])
    assert (how, comm, zygote_tasks) == (started, "aioloader-fork", 1), out
    assert helper == [[1, 1]] * 4, helper  # torch's and libgomp's threads, in each worker
    if order in ("forward", "python-thread", "unknown-thread"):
        assert threads >= 3, threads  # the threads the order made were there
    assert session_survivors(proc.pid) == []


NOTEBOOK = (
    """
import json, os, sys

folder, jupyter = sys.argv[1:3]
"""
    + KERNEL_SPEC
    + """

import nbformat
from nbclient import NotebookClient

cells = [
    "import os, json, threading, torch\\nimport aioloader\\nfrom aioloader.procs import zygote",
    "torch.set_num_threads(2)\\nmodel = torch.nn.Linear(512, 512)\\nmodel(torch.randn(64, 512))\\n"
    "torch.ones(4_000_000).add_(1)",
    "def decode(data):\\n    print('decoded', len(data))  # a helper's print, past the kernel's streams\\n"
    "    return aioloader.ImageDecoder(32)(data)",
    f"ds = aioloader.FileDataset.from_folder({folder!r})\\n"
    "with aioloader.Loader(ds, batch_size=8, decode=decode, shuffle=False) as loader:\\n"
    "    labels = [y for _, ys in loader for y in ys.tolist()]\\n"
    "zpid = zygote.pid()\\n"
    "print(json.dumps([zygote.started_by(), labels == ds.labels.tolist(), threading.active_count(),\\n"
    "                  len(os.listdir(f'/proc/{zpid}/task'))]))",
]
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
NotebookClient(nb, timeout=120, kernel_name="aioloader-test").execute()
for out in nb.cells[-1].get("outputs", []):
    if out.get("name") == "stdout":
        sys.stdout.write(out["text"])
"""
)


@pytest.mark.timeout(200)
def test_a_notebook_that_ran_a_forward_pass_forks_its_zygote(image_folder: Path, tmp_path: Path) -> None:
    """A real Jupyter kernel (its Python threads, libzmq's, PyTorch's pools after a forward
    pass) forks its zygote; a helper's ``print`` takes none of the kernel's locks, and the
    epoch is whole."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    driver = tmp_path / "driver.py"
    proc = start_script(driver, NOTEBOOK, args=[str(driver), str(image_folder), str(tmp_path / "jupyter")])
    out, err = finish_script(proc, timeout=180)
    assert proc.returncode == 0, err[-4000:]
    how, whole, python_threads, zygote_tasks = json.loads(
        [line for line in out.splitlines() if line.startswith("[")][-1]
    )
    assert (how, whole, zygote_tasks) == ("fork", True, 1), out
    assert python_threads > 3  # the kernel's threads were there
    assert session_survivors(proc.pid) == []


CUDA_TRAIN = """
import json, os, torch
import aioloader
from aioloader.procs import zygote

model = torch.nn.Linear(512, 512).cuda()
model(torch.randn(64, 512, device="cuda")).sum().backward()  # the driver's and autograd's threads
torch.cuda.synchronize()
threads = len(os.listdir("/proc/self/task"))
ds = aioloader.FileDataset.from_folder({folder!r})
decoder = aioloader.ImageDecoder(32)
with aioloader.Loader(ds, batch_size=8, decode=decoder, shuffle=False, device="cuda") as loader:
    labels = []
    for images, y in loader:
        assert images.is_cuda
        labels += y.tolist()
zpid = zygote.pid()
zygote_tasks = len(os.listdir(f"/proc/{{zpid}}/task"))
print(json.dumps([zygote.started_by(), labels == ds.labels.tolist(), threads, zygote_tasks]))
"""


@pytest.mark.cuda
@pytest.mark.timeout(200)
def test_a_trainer_with_a_cuda_context_forks_its_zygote(image_folder: Path, tmp_path: Path) -> None:
    """CUDA, then the loader: the zygote is forked past the driver's threads (PyTorch makes
    CUDA an error in the copy), and the epoch reaches the GPU whole."""
    script = CUDA_TRAIN.format(folder=str(image_folder))
    proc = start_script(tmp_path / "train.py", script, args=["train.py"], cwd=tmp_path)
    out, err = finish_script(proc, timeout=180)
    assert proc.returncode == 0, err[-4000:]
    how, whole, threads, zygote_tasks = json.loads(out.splitlines()[-1])
    assert (how, whole, zygote_tasks) == ("fork", True, 1), (out, threads)
    assert session_survivors(proc.pid) == []
