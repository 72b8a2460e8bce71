"""Any callable, wherever the training script runs: lambdas, closures and callable objects as
``decode``, ``read`` and ``collate``; functions defined or redefined in ``__main__`` after a
loader started; scripts started by a relative path, a symlink or ``python -m``, guarded or
not; callables that cannot be sent, or that do not load in the process that runs them.

Every case runs in both runtimes: ``[thread]`` (the pipeline in the trainer's process) and
``[process]`` (``loader_process=True``: it insists, so a callable that cannot be sent is an
error). The Jupyter kernel case is in test_notebook.py.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from faults import LoadsOnlyHere, loader_inside
from helpers import RuntimeWatch, decode_number, finish_script, new_shm_entries, process_tree, start_script

from aioloader import DecodeError, Loader, LoaderError, WorkerCrashedError


@pytest.fixture(params=[False, True], ids=["thread", "process"])
def loader_process(request: pytest.FixtureRequest, runtimes: RuntimeWatch) -> bool:
    """Both runtimes; a loader of the test's own process that ran in the other one fails it
    (``runtimes``, conftest.py). Scripts check theirs themselves."""
    runtimes.expect(bool(request.param))
    return bool(request.param)


def semaphores() -> set[str]:
    """aioloader's named POSIX semaphores in /dev/shm (a decode pool makes five) made by
    this process, a descendant (a loader process) or a process gone since."""
    return {n for n in new_shm_entries((), {os.getpid()} | process_tree()) if n.startswith("sem.")}


def test_lambdas_closures_and_local_classes_as_decode_read_and_collate(
    numbered: list[str], loader_process: bool
) -> None:
    offset = 1000

    def make_decode(k: int) -> object:
        return lambda data: np.array([int(data[7:]) + k, os.getpid()])  # a closure over k

    class Upper:  # defined in a function: no module can find it by name
        def __call__(self, path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read().upper()

    loader = Loader(
        numbered,
        batch_size=8,
        shuffle=False,
        decode=make_decode(offset),  # type: ignore[arg-type]
        read=Upper(),
        collate=lambda samples: (torch.from_numpy(np.stack(samples)), os.getpid()),
        num_workers=2,
        loader_process=loader_process,
    )
    with loader:
        batches = list(loader)
    rows = torch.cat([b[0] for b in batches])
    assert rows[:, 0].tolist() == [offset + i for i in range(len(numbered))]
    assert os.getpid() not in rows[:, 1].tolist()  # decoded in the workers
    collated_in = {pid for _, pid in batches}
    assert len(collated_in) == 1
    assert (os.getpid() in collated_in) is not loader_process  # the loader process collates


REDEFINED = """
import glob, json, sys, threading
import numpy as np
import aioloader

paths = sorted(glob.glob(sys.argv[1] + "/*.txt"))
loops = []  # per loader: did its event loop run in this process (in-process runtime)?


def first(decode):
    with aioloader.Loader(paths, batch_size=4, shuffle=False, decode=decode, num_workers=2,
                          loader_process=sys.argv[2] == "process") as loader:
        batch = next(iter(loader)).tolist()
        loops.append(any(t.name == "aioloader-loop" for t in threading.enumerate()))
        return batch


def decode(data):
    return np.array([1])


out = {"first": first(decode)}


def decode(data):  # the cell edited and run again
    return np.array([2, 2])


out["redefined"] = first(decode)


def val_decode(data):  # first defined after a loader started
    return np.array([3, 3, 3])


out["new"] = first(val_decode)
out["lambda"] = first(lambda data: np.array([int(data[7:]) * 10]))


class Refused(Exception):  # a class of __main__ that the workers never saw by name
    pass


def refuse(data):
    raise Refused("not this one")


try:
    first(refuse)
except aioloader.DecodeError as exc:
    out["cause"] = [type(exc.__cause__).__name__, isinstance(exc.__cause__, Refused)]
out["loops_here"] = loops
print(json.dumps(out))
"""


def test_main_functions_defined_or_redefined_after_a_loader_started(
    tmp_path: Path, numbered: list[str], loader_process: bool
) -> None:
    runtime = "process" if loader_process else "thread"
    script = tmp_path / "redefine.py"
    proc = start_script(script, REDEFINED, args=[str(script), os.path.dirname(numbered[0]), runtime])
    out, err = finish_script(proc, timeout=90)
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert result["first"] == [[1]] * 4
    assert result["redefined"] == [[2, 2]] * 4  # not the definition the zygote holds
    assert result["new"] == [[3, 3, 3]] * 4  # not a crash: no worker looks it up by name
    assert result["lambda"] == [[0], [10], [20], [30]]
    assert result["cause"] == ["Refused", True]  # the script's own class, so `except Refused` works
    assert result["loops_here"] == [not loader_process] * 4  # each loader ran where it asked


TRAIN = """
import glob, json, os, sys, threading
import numpy as np
import aioloader

log, runtime, folder = sys.argv[1:4]
with open(log, "a") as f:  # the script's top level: must run once, in this process only
    f.write(f"{os.getpid()}\\n")


def decode(data):
    return np.array([int(data[7:]), os.getpid()])


def main():
    paths = sorted(glob.glob(folder + "/*.txt"))
    with aioloader.Loader(paths, batch_size=8, shuffle=False, decode=decode, num_workers=2,
                          loader_process=runtime == "process") as loader:
        rows = np.concatenate([b.numpy() for b in loader])
        loop_here = any(t.name == "aioloader-loop" for t in threading.enumerate())
    print(json.dumps({"pid": os.getpid(), "numbers": rows[:, 0].tolist(),
                      "decoded_in": sorted(set(rows[:, 1].tolist())), "loop_here": loop_here}))


"""


@pytest.mark.parametrize(
    ("how", "guarded"),
    [("../train.py", True), ("../train.py", False), ("symlink", False), ("-m", False)],
)
def test_a_script_however_started_runs_its_top_level_once(
    tmp_path: Path, numbered: list[str], loader_process: bool, how: str, guarded: bool
) -> None:
    """``python ../train.py`` from a run folder (its ``__file__`` keeps the ``..``), a
    symlink to the script, ``python -m train``: guarded or not, the top level runs once and
    the script finishes (unguarded, a worker running it again used to hang for ever)."""
    project = tmp_path / "project"
    run = project / "runs" / "a"
    run.mkdir(parents=True)
    script = project / "train.py"
    body = TRAIN + ('if __name__ == "__main__":\n    main()\n' if guarded else "main()\n")
    log = tmp_path / "toplevel.log"
    rest = [str(log), "process" if loader_process else "thread", os.path.dirname(numbered[0])]
    if how == "symlink":
        (run / "link.py").symlink_to(script)
        args, cwd = ["link.py", *rest], run
    elif how == "-m":
        args, cwd = ["-m", "train", *rest], project
    else:
        args, cwd = [how, *rest], run / ".."
    proc = start_script(script, body, args=args, cwd=cwd)
    out, err = finish_script(proc, timeout=90)
    assert proc.returncode == 0, f"{how} {'guarded' if guarded else 'unguarded'}: {err[-3000:]}"
    result = json.loads(out)
    assert log.read_text().split() == [str(result["pid"])]  # no worker ran the top level
    assert result["numbers"] == list(range(len(numbered)))
    assert result["pid"] not in result["decoded_in"]
    assert result["loop_here"] is not loader_process  # in-process, or in a loader process as asked


class HoldsALock:
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, data: bytes) -> np.ndarray:
        with self.lock:
            return decode_number(data)


def test_a_decode_that_cannot_be_sent_is_one_value_error_naming_it(
    numbered: list[str], loader_process: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    before = semaphores()
    with pytest.raises(
        ValueError, match=r"^decode=<test_callables.HoldsALock object at .*> cannot be sent"
    ) as info:
        Loader(numbered, decode=HoldsALock(), loader_process=loader_process)
    assert "cannot pickle '_thread.lock' object" in str(info.value)
    assert "Traceback" not in capfd.readouterr().err  # nothing printed from a thread
    assert semaphores() - before == set()


def test_a_read_that_cannot_be_sent_is_refused_only_where_it_must_be_sent(
    numbered: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """``loader_process=True`` must send it: a ValueError naming it. The default, ``"auto"``,
    then loads in-process (a DEBUG line, no warning), as ``loader_process=False`` does."""
    lock = threading.Lock()

    def read(path: str) -> bytes:
        with lock, open(path, "rb") as f:
            return f.read()

    with pytest.raises(ValueError, match=r"^read=<function .*read.*> cannot be sent to the loader process"):
        Loader(numbered, decode=decode_number, read=read, loader_process=True)
    caplog.set_level(logging.DEBUG, logger="aioloader")
    for where in ({}, {"loader_process": "auto"}, {"loader_process": False}):
        caplog.clear()
        with Loader(
            numbered, batch_size=37, shuffle=False, decode=decode_number, read=read, **where
        ) as loader:
            assert [int(x) for b in loader for x in b] == list(range(37))  # runs where it is
            assert loader.runtime == "thread"
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        said = [r.getMessage() for r in caplog.records if "cannot be sent" in r.getMessage()]
        if where.get("loader_process", "auto") == "auto":
            assert len(said) == 1 and said[0].startswith("loader_process='auto': loading in-process: read=")
        else:
            assert said == []


def test_a_decode_that_does_not_load_where_it_runs_is_one_loader_error(
    numbered: list[str], loader_process: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    """Any failed start, whatever its cause, is one clear error and leaves nothing behind
    (the leak check: no process, thread, fd or segment; and no semaphore)."""
    before = semaphores()
    loader = Loader(
        numbered, batch_size=4, decode=LoadsOnlyHere(), num_workers=2, loader_process=loader_process
    )
    with pytest.raises(LoaderError) as info, loader:
        next(iter(loader))
    assert not isinstance(info.value, WorkerCrashedError)  # a worker that could not load is no crash
    assert "decode" in str(info.value) and "could not be loaded" in str(info.value)
    assert "can only be loaded in process" in str(info.value) + str(info.value.__cause__)
    assert "Traceback" not in capfd.readouterr().err
    assert semaphores() - before == set()


def test_a_loader_made_inside_a_worker_is_a_clear_error(numbered: list[str], loader_process: bool) -> None:
    with (
        Loader(
            numbered[:4], batch_size=4, decode=loader_inside, num_workers=1, loader_process=loader_process
        ) as loader,
        pytest.raises(DecodeError) as info,
    ):
        next(iter(loader))
    assert isinstance(info.value.__cause__, LoaderError)
    assert "cannot be started inside aioloader's own worker process" in str(info.value.__cause__)


def test_a_loader_made_inside_the_loader_process_is_a_clear_error(numbered: list[str]) -> None:
    """docs/how-it-works/memory.md ("No loader inside a helper"): no Loader from code that
    runs in the loader process either (a ``collate``, with ``loader_process=True``, runs
    there)."""

    def collate(samples: list[object]) -> object:
        Loader([os.devnull], decode=None).start()
        return samples

    with (
        Loader(
            numbered[:4], batch_size=4, decode=decode_number, collate=collate, loader_process=True
        ) as loader,
        pytest.raises(LoaderError) as info,
    ):
        next(iter(loader))
    assert "cannot be started inside aioloader's own loader process" in str(info.value)


def test_the_main_module_never_reaches_a_worker() -> None:
    """The preparation data a helper starts with names no main module (the zygote and the
    stock fork server alike): nothing can make a helper import the script."""
    from aioloader.procs import forking

    data = forking.preparation_data("aioloader-worker")
    assert not {"init_main_from_path", "init_main_from_name"} & data.keys()
    assert data["sys_path"] and data["dir"] == os.getcwd()
