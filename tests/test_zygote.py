"""A fast first batch. The zygote: decode workers are forked by a fork server made before the
loader had any thread (a fork of a single-threaded trainer, or a fresh interpreter that
preloaded what they import: tests/test_zygote_threads.py), so a decode function defined in
the training script (which imports torch) starts without importing anything. Hot start: until
the workers are up, the built-in ``ImageDecoder`` decodes on a thread of the loader's
process, seen here by holding the workers back. Scripts run in their own session; what they
leave behind is found with pgrep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from faults import Fault
from helpers import (
    LoggedRead,
    WhereDecoded,
    decode_number,
    descendants,
    finish_script,
    flatten,
    named,
    script_env,
    session_survivors,
    start_script,
)

from aioloader import FileDataset, ImageDecoder, Loader
from aioloader.procs import zygote

WORKER, LOADER = "aioloader-work", "aioloader-loop"  # /proc/<pid>/comm
HANG_GUARD = 60.0  # seconds; only ever reached when the promise is broken

SCRIPT = """
import os, sys
import numpy as np
import torch  # what a training script imports: the workers must not import it again
import aioloader

def decode(data):  # defined in __main__, as most users' functions are
    return np.full((2, 2), int(data.decode()[7:]), dtype=np.uint8)

if __name__ == "__main__":
    paths = {paths!r}
    with aioloader.Loader(paths, batch_size=4, decode=decode, num_workers=2, shuffle=False) as loader:
        it = iter(loader)
        first = next(it)
        rest = [int(v) for b in [first, *it] for v in b[:, 0, 0]]
        assert rest == list(range(len(paths))), rest
        zpid = str(aioloader.procs.zygote.pid())
        print("zygote", zpid, flush=True)
        ppid = lambda p: open(f"/proc/{{p}}/stat").read().rsplit(")", 1)[1].split()[1]
        comm = lambda p: open(f"/proc/{{p}}/comm").read().strip()
        kids = [p for p in os.listdir("/proc") if p.isdigit() and ppid(p) == zpid]
        print("pids", *sorted(p for p in kids if comm(p) == "aioloader-work"), flush=True)
        print("loaders", *sorted(p for p in kids if comm(p) == "aioloader-loop"), flush=True)
"""


def test_workers_come_from_the_zygote(numbered: list[str]) -> None:
    assert zygote.pid() is not None  # conftest starts it before the first test
    with Loader(numbered, batch_size=5, decode=decode_number, num_workers=2, shuffle=False) as loader:
        assert [int(v) for b in loader for v in b] == list(range(37))
        helpers = descendants()
        workers, loaders = named(WORKER), named(LOADER)
        parents = set()
        for pid in helpers:
            with open(f"/proc/{pid}/stat") as f:
                parents.add(int(f.read().rsplit(")", 1)[1].split()[1]))
    # The loader process (the default) and its two workers: all the zygote's children.
    assert len(workers) == 2 and len(loaders) == 1 and helpers == workers | loaders
    assert parents == {zygote.pid()}


def test_a_script_that_imports_torch_decodes_in_workers_of_the_zygote_and_leaves_nothing(
    numbered: list[str], tmp_path: Path
) -> None:
    """How fast its first batch comes is measured by benchmarks/throughput.py (first batch,
    start-up included), not here: tests do not time."""
    proc = start_script(tmp_path / "train.py", SCRIPT.format(paths=numbered))
    out, err = finish_script(proc)
    assert proc.returncode == 0, err
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    zygote_pid = int(lines["zygote"])
    # Both workers are its children, and so is the loader process they decode for.
    assert zygote_pid and len(lines["pids"].split()) == 2 and len(lines["loaders"].split()) == 1
    assert session_survivors(proc.pid) == []


PRELOADED = """
import sys
import numpy as np
import torch
import aioloader

HELPERS = ("numpy.random", "PIL.JpegImagePlugin")  # what a worker needs, the trainer lacked

def decode(data):  # 1 where the worker holds the modules without having imported them
    return np.full((2, 2), all(m in sys.modules for m in HELPERS), dtype=np.uint8)

if __name__ == "__main__":
    print("before", *[m in sys.modules for m in HELPERS], flush=True)
    with aioloader.Loader({paths!r}, batch_size=4, decode=decode, num_workers=2) as loader:
        print("workers", *sorted({{int(v) for b in loader for v in b[:, 0, 0]}}), flush=True)
    print("after", *[m in sys.modules for m in HELPERS], flush=True)
"""


def test_a_forked_zygote_brings_the_helpers_modules_the_trainer_lacked(
    numbered: list[str], tmp_path: Path
) -> None:
    """Modules the helpers need and the trainer had not imported (numpy's random generators,
    Pillow's JPEG plugin) are imported by the trainer as it forks the zygote, so every helper
    holds them from the start, sharing their pages, rather than importing its own copy."""
    proc = start_script(tmp_path / "train.py", PRELOADED.format(paths=numbered[:12]))
    out, err = finish_script(proc)
    assert proc.returncode == 0, err
    assert out.split("\n")[:3] == ["before False False", "workers 1", "after True True"], out


def test_no_zygote_once_loader_threads_exist(tmp_path: Path) -> None:
    """A process whose loader threads already run gets no zygote (a fork then could copy a
    held lock): its workers come from the stock fork server."""
    code = textwrap.dedent(
        """
        import threading, time
        from aioloader.procs import zygote
        t = threading.Thread(target=time.sleep, args=(1,), name="aioloader-loop", daemon=True)
        t.start()
        print(zygote.context(), zygote.pid())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=script_env(), capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.split() == ["None", "None"]


PRELOAD = """
import os, sys, threading, time
from multiprocessing import forkserver
import numpy as np
import imported_by_the_script  # its top level logs the pid of each process that imports it
from aioloader import Loader

# A loader thread before the first loader: no zygote, the stock fork server makes the workers.
threading.Thread(target=time.sleep, args=(30,), name="aioloader-other", daemon=True).start()

def decode(data):
    return np.array([imported_by_the_script.BASE + int(data.decode()[7:])])

if __name__ == "__main__":
    with Loader({paths!r}, batch_size=5, decode=decode, num_workers=2, shuffle=False) as loader:
        print("got", *[int(v) for b in loader for v in b])
        print("server", forkserver._forkserver._forkserver_pid)
"""


def test_without_a_zygote_the_fork_server_preloads_what_the_script_imported(
    numbered: list[str], tmp_path: Path
) -> None:
    """docs/guides/environments.md ("Where the loader runs"): where no zygote can be made,
    workers come from the stock fork server, which has imported the script's imports before
    forking them: the module the decode function uses is imported by the script and by the
    fork server, never by a worker (its top level logs who imports it)."""
    log = tmp_path / "imported-by"
    (tmp_path / "imported_by_the_script.py").write_text(
        f"import os\nwith open({str(log)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\nBASE = 1000\n"
    )
    proc = start_script(tmp_path / "train.py", PRELOAD.format(paths=numbered[:10]), cwd=tmp_path)
    out, err = finish_script(proc)
    assert proc.returncode == 0, err
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    assert lines["got"].split() == [str(1000 + i) for i in range(10)]
    assert sorted(map(int, log.read_text().split())) == sorted([proc.pid, int(lines["server"])])


# -- hot start ---------------------------------------------------------------------------------


@contextmanager
def released_after_the_first_batch(release: Callable[[], None]) -> Iterator[threading.Event]:
    """Yields an event for the test to set once it holds the first batch; ``release`` (which
    lets the held-back workers start) runs then. Without hot start the first batch needs the
    workers, so a hang guard releases them after HANG_GUARD seconds and the test's assertions
    fail instead of hanging; a working hot start never gets near it."""
    got_first = threading.Event()

    def wait_then_release() -> None:
        got_first.wait(HANG_GUARD)
        release()

    opener = threading.Thread(target=wait_then_release, name="test-release-workers")
    opener.start()
    try:
        yield got_first
    finally:
        got_first.set()
        opener.join()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD  # a hang guard, not a speed claim
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("loader_process", [False, True], ids=["thread", "process"])
def test_until_the_workers_are_up_image_decoder_decodes_in_the_loaders_process(
    image_folder: Path, tmp_path: Path, loader_process: bool
) -> None:
    """The workers are held back (each waits for a gate file as it unpickles its decoder):
    the first batch still arrives, decoded in the loader's own process (the trainer's, or
    the loader process); once the workers are up, they decode everything."""
    gate = tmp_path / "gate"
    ds = FileDataset.from_folder(image_folder)
    decode = WhereDecoded(32, str(gate))
    with (
        released_after_the_first_batch(gate.touch) as got_first,
        Loader(
            ds,
            batch_size=2,
            shuffle=False,
            decode=decode,
            num_workers=2,
            io_concurrency=2,
            prefetch=1,
            loader_process=loader_process,
        ) as loader,
    ):
        it = iter(loader)
        (images, pids), labels = next(it)
        got_first.set()
        # Plain values: a failed assertion must not keep the batch's shared memory alive.
        first_pids, first_labels = set(pids.tolist()), labels.tolist()
        first_images = [images[row].numpy().tolist() for row in range(2)]
        del images, pids, labels
        here = named(LOADER) if loader_process else {os.getpid()}
        assert len(here) == 1
        assert first_pids == here, "the first batch waited for the workers: no hot start"
        for row in range(2):  # what the built-in ImageDecoder makes of those files
            with open(ds.path(row), "rb") as f:
                assert first_images[row] == ImageDecoder(32)(f.read()).tolist()
        assert ds.labels is not None and first_labels == ds.labels[:2].tolist()
        wait_for(lambda: len(list(tmp_path.glob("gate.*"))) == 2, "both workers passed the gate")
        workers = named(WORKER)
        assert len(workers) == 2 and not workers & here
        rest = [p for (_, p), _ in it]
        assert sum(len(p) for p in rest) == len(ds) - 2
        loader.set_epoch(1)  # long after the workers came up: theirs alone
        later = {pid for (_, p), _ in loader for pid in p.tolist()}
    assert later <= workers and later, (later, workers)


def test_the_built_in_image_decoder_delivers_while_no_worker_can_be_forked(image_folder: Path) -> None:
    """What users get, seen from outside: with the zygote stopped (SIGSTOP), no decode worker
    can be forked, yet the first batch of a plain ``ImageDecoder`` arrives; once the zygote
    runs again, the workers start and the epoch completes. In the trainer's process only
    (``loader_process=False``): a loader process is itself forked by the zygote."""
    zpid = zygote.pid()
    assert zpid is not None  # conftest starts it before the first test

    def state() -> str:
        with open(f"/proc/{zpid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def resume() -> None:
        os.kill(zpid, signal.SIGCONT)

    ds = FileDataset.from_folder(image_folder)
    os.kill(zpid, signal.SIGSTOP)
    try:
        wait_for(lambda: state() == "T", "the zygote stopped")
        with (
            released_after_the_first_batch(resume) as got_first,
            Loader(
                ds, batch_size=4, shuffle=False, decode=ImageDecoder(32), num_workers=2, loader_process=False
            ) as loader,
        ):
            it = iter(loader)
            images, labels = next(it)
            no_worker_yet = descendants()
            got_first.set()
            shape, first_labels = tuple(images.shape), labels.tolist()
            del images, labels  # a failed assertion must not keep the batch's memory alive
            assert no_worker_yet == set(), "the first batch waited for the workers: no hot start"
            assert ds.labels is not None and first_labels == ds.labels[:4].tolist()
            assert shape == (4, 3, 32, 32)
            wait_for(lambda: len(named(WORKER)) == 2, "the workers started once the zygote ran again")
            assert sum(len(y) for _, y in it) == len(ds) - 4
            loader.set_epoch(1)
            assert sum(len(y) for _, y in loader) == len(ds)
    finally:
        resume()


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.timeout(60)
def test_decode_slots_go_to_the_earliest_batch_first(numbered: list[str], tmp_path: Path) -> None:
    """docs/how-it-works/index.md ("Order": no head-of-line blocking): decode slots go to
    the earliest batch of the epoch first, in the trainer's process
    (``loader_process=False``: a loader process is itself forked by the zygote). With the
    zygote stopped the pool cannot start, so its slots stay closed while all 37 reads
    finish, samples 0-2 last (their reads are slowed); every sample after the third hangs
    for longer than the test may run. Once the zygote runs again the slots open, to samples
    0, 1 and 2 first: the first three batches arrive. Handed out in the order the reads
    finished, they would put hanging samples on both workers and the test would time out."""
    zpid = zygote.pid()
    assert zpid is not None  # conftest starts it before the first test
    log = tmp_path / "reads"
    read = LoggedRead(str(log), slow=frozenset(numbered[:3]), seconds=0.2)
    hang = Fault("hang", set(range(3, 100)), seconds=600)
    os.kill(zpid, signal.SIGSTOP)
    try:
        wait_for(lambda: stopped(zpid), "the zygote stopped")
        with Loader(
            numbered,
            batch_size=1,
            shuffle=False,
            decode=hang,
            read=read,
            num_workers=2,
            io_concurrency=64,
            loader_process=False,
        ) as loader:
            it = iter(loader)
            wait_for(lambda: log.is_file() and log.read_text().count("\n") == 37, "every read done")
            assert sorted(log.read_text().split()[-3:]) == ["f00000.txt", "f00001.txt", "f00002.txt"]
            os.kill(zpid, signal.SIGCONT)
            assert flatten([next(it), next(it), next(it)]) == [0, 1, 2]
    finally:
        os.kill(zpid, signal.SIGCONT)
