"""A loader process (the default ``loader_process="auto"``, or True): the pipeline runs in a
loader process; the trainer's process keeps only the bridging thread, and batches cross as
references to shared memory. Where none can be made, ``"auto"`` loads in-process silently
and True with a warning.

Everything is read from the outside: threads by name, processes from /proc, mappings from
/proc/self/maps, the loader process's memfd slabs from /proc/<pid>/fd (its segments in
/dev/shm with ``AIOLOADER_SLABS=devshm``). The general suite (test_loader.py) runs again in this
mode; these tests cover what only this mode has.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import (
    decode_number,
    descendants,
    is_gone,
    memfd_slabs,
    named,
    number_image,
    number_ragged,
    script_env,
    shm_entries,
    shm_mapping,
    shm_segments,
    slab_mappings,
)

from aioloader import DecodeError, Loader, LoaderError, ReadError
from aioloader.memory.slabs import shm_available
from aioloader.run.wire import SPILL_BYTES

pytestmark = pytest.mark.skipif(not shm_available(), reason="needs shared memory (memfd or /dev/shm)")


def loader_pid() -> int:
    """The loader process: of this process's helpers (the zygote forks it and then, at its
    request, its workers), the one started first."""
    kids = descendants()
    assert kids
    return min(kids, key=_started)


def _started(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])  # starttime, in clock ticks


def numbers(batch: torch.Tensor) -> list[int]:
    return [int(v) for v in batch.reshape(len(batch), -1)[:, 0]]


def test_same_batches_as_in_process_as_views_of_the_loader_processes_slabs(numbered: list[str]) -> None:
    def epochs(**kw: Any) -> list[list[list[int]]]:
        with Loader(numbered, batch_size=4, decode=number_image, num_workers=2, seed=5, **kw) as loader:
            return [[numbers(b) for b in loader] for _ in range(2)]

    assert epochs(loader_process=True) == epochs(loader_process=False)
    with Loader(numbered, batch_size=4, decode=number_image, num_workers=2, loader_process=True) as loader:
        pid = loader_pid()
        list(loader)
        batches = list(loader)
        # The trainer's process holds the bridge alone (and the SIGTERM watcher).
        ours = {t.name for t in threading.enumerate() if t.name.startswith("aioloader-")}
        assert ours <= {"aioloader-transfer", "aioloader-signals"}
        # Batches of the second epoch are the loader process's slabs, mapped here.
        assert all(shm_mapping(b, maker=pid) is not None for b in batches[:-1])
        assert shm_segments(pid)
    # Closed: the process and its segments are gone; batches still held stay valid.
    assert is_gone(pid) and shm_segments(pid) == set()
    assert sorted(n for b in batches for n in numbers(b)) == list(range(37))
    # Once they are dropped, nothing of the slabs is left here: no mapping, no descriptor.
    del batches
    gc.collect()
    assert slab_mappings() == [] and memfd_slabs(maker=pid) == set()


def test_held_batches_never_change_while_slabs_are_reused(numbered: list[str]) -> None:
    with Loader(
        numbered, batch_size=4, decode=number_image, num_workers=2, prefetch=1, loader_process=True
    ) as loader:
        pid = loader_pid()
        list(loader)  # the first epoch teaches the layout (its batches may cross as copies)
        held = list(loader)  # every batch of the second one kept: its slabs must not be reused
        pinned = {shm_mapping(b, maker=pid) for b in held}
        assert None not in pinned and len(pinned) == len(held)
        snapshot = [b.clone() for b in held]
        later: list[str | None] = []
        for _ in range(4):
            for b in loader:
                later.append(shm_mapping(b, maker=pid))
                del b
        assert all(torch.equal(a, b) for a, b in zip(held, snapshot, strict=True))
        # Every later batch is one of the loader process's slabs. Dropped batches' slabs went
        # back for reuse: 40 batches in far fewer slabs, none of them a held batch's.
        assert None not in later and len(later) == 40
        assert len(set(later)) < len(later) // 2
        assert not set(later) & pinned


def test_varying_shapes_reach_the_trainer_as_views(numbered: list[str]) -> None:
    with Loader(
        numbered,
        batch_size=6,
        decode=number_ragged,
        collate=list,
        shuffle=False,
        num_workers=2,
        loader_process=True,
    ) as loader:
        list(loader)
        second = list(loader)
    got = [(int(arr[0, 0]), tuple(arr.shape)) for batch in second for arr in batch]
    assert got == [(n, (n % 4 + 1, 2)) for n in range(37)]


def test_errors_name_the_file_and_keep_their_cause(tmp_path: Path, numbered: list[str]) -> None:
    paths = [*numbered[:4], str(tmp_path / "missing.txt"), *numbered[4:8]]
    with Loader(
        paths, batch_size=2, decode=decode_number, shuffle=False, num_workers=1, loader_process=True
    ) as loader:
        it = iter(loader)
        assert [int(v) for _ in range(2) for v in next(it)] == [0, 1, 2, 3]
        with pytest.raises(ReadError) as info:
            next(it)
        assert info.value.path == paths[4] and isinstance(info.value.__cause__, FileNotFoundError)
        assert any("in the loader process" in note for note in info.value.__notes__)
        # The loader stays usable.
        assert [int(v) for v in next(iter(loader))] == [0, 1]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"not a number")
    with Loader([str(bad)], batch_size=1, decode=decode_number, num_workers=1, loader_process=True) as loader:
        with pytest.raises(DecodeError, match=r"bad\.txt") as err:
            list(loader)
        assert "--- worker traceback ---" in str(err.value) and "decode_number" in str(err.value)


def test_skipped_files_are_logged_here_and_counted(
    tmp_path: Path, numbered: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    paths = [*numbered[:5], str(tmp_path / "gone.txt")]
    with (
        caplog.at_level(logging.WARNING, logger="aioloader"),
        Loader(
            paths, batch_size=2, decode=decode_number, on_error="skip", num_workers=1, loader_process=True
        ) as loader,
    ):
        assert sorted(int(v) for b in loader for v in b) == [0, 1, 2, 3, 4]
        stats = loader.stats
    assert stats.failures == 1 and stats.last_failed_paths == (paths[5],) and stats.attempted == 6
    assert stats.bytes_read > 0 and stats.samples == 5
    assert any("gone.txt" in r.getMessage() for r in caplog.records if r.name == "aioloader")


def test_resume_with_restored_failures(numbered: list[str]) -> None:
    def make() -> Loader:
        return Loader(
            numbered, batch_size=4, decode=decode_number, seed=3, num_workers=1, loader_process=True
        )

    with make() as loader:
        whole = [[int(v) for v in b] for b in loader]
    with make() as loader:
        it = iter(loader)
        first = [[int(v) for v in next(it)] for _ in range(3)]
        state = loader.state_dict()
    state["stats"]["failures_by_reason"] = {"ReadError": 2}
    with make() as loader:
        loader.load_state_dict(state)
        rest = [[int(v) for v in b] for b in loader]
        assert loader.stats.failures == 2  # restored, and not lost to the loader process's counts
    assert first + rest == whole


def test_a_collate_that_cannot_be_sent_is_refused_when_the_loader_is_made(numbered: list[str]) -> None:
    lock = threading.Lock()
    with pytest.raises(
        ValueError, match=r"^collate=<function .*<lambda>.* cannot be sent to the loader process"
    ) as info:
        Loader(numbered, batch_size=4, decode=decode_number, collate=lambda s: lock, loader_process=True)
    assert "cannot pickle '_thread.lock' object" in str(info.value)
    # In the trainer's process the same collate runs where it is: nothing is sent. The
    # default, "auto", loads there, without a warning.
    for where in ({"loader_process": False}, {}):
        with Loader(numbered, batch_size=4, decode=decode_number, collate=lambda s: lock, **where) as loader:
            assert all(batch is lock for batch in loader)
            assert loader.runtime == "thread"


def test_a_killed_loader_process_is_a_clear_error(numbered: list[str]) -> None:
    with Loader(
        numbered, batch_size=1, decode=decode_number, num_workers=1, prefetch=1, loader_process=True
    ) as loader:
        it = iter(loader)
        next(it)
        pid = loader_pid()
        assert any(maker == pid for maker in shm_entries().values())  # its decode pool's semaphores
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(LoaderError, match="loader process exited unexpectedly"):
            for _ in range(len(numbered)):
                next(it)
    # Its workers follow it (their lifeline), and nothing is left: what it could not remove
    # itself (its semaphores), the trainer removed when it closed the loader, not at exit.
    assert [name for name, maker in shm_entries().items() if maker == pid] == []
    deadline = time.monotonic() + 5
    while descendants() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert descendants() == set()


def test_async_for_over_a_loader_process(numbered: list[str]) -> None:
    async def main() -> list[int]:
        async with Loader(
            numbered, batch_size=4, decode=decode_number, shuffle=False, num_workers=1, loader_process=True
        ) as loader:
            return [int(v) for b in [b async for b in loader] for v in b]

    assert asyncio.run(main()) == list(range(37))


def test_numpy_from_a_custom_collate_arrives_as_tensors(numbered: list[str]) -> None:
    with Loader(
        numbered,
        batch_size=4,
        decode=number_image,
        collate=np.stack,
        shuffle=False,
        num_workers=1,
        loader_process=True,
    ) as loader:
        batches = list(loader)
    assert all(isinstance(b, torch.Tensor) and b.shape[1:] == (3, 4, 5) for b in batches)
    assert [n for b in batches for n in numbers(b)] == list(range(37))


def spilled(pid: int) -> set[str]:
    """The one-shot segments (``aioloader-<pid>-s<n>-...``) loader process ``pid`` holds."""
    return {name for name in memfd_slabs(pid) if name.startswith(f"aioloader-{pid}-s")}


class BigCollate:
    """A custom collate that builds a new, large tensor (as users' collate functions do):
    each sample's number repeated over 128 KiB of int32: 2 MiB a batch of 16, 640 KiB the
    last batch of 5."""

    def __call__(self, samples: list[np.ndarray]) -> dict[str, Any]:
        n = torch.tensor([int(s.reshape(-1)[0]) for s in samples])
        return {"big": n[:, None].repeat(1, 1 << 15).to(torch.int32), "n": n}


def test_large_tensors_a_collate_builds_cross_through_shared_memory(numbered: list[str]) -> None:
    """Not the pipe: one copy in the loader process into a segment the trainer maps. A
    segment is reused once the trainer lets go of its batch, never while a batch shows it,
    and every one goes at close."""
    with Loader(
        numbered, batch_size=16, decode=number_image, collate=BigCollate(), num_workers=2, loader_process=True
    ) as loader:
        pid = loader_pid()
        kept: dict[str, torch.Tensor] | None = None
        names: list[str] = []
        for _ in range(4):
            batches = list(loader)
            assert sorted(int(v) for b in batches for v in b["n"]) == list(range(37))
            for b in batches:
                assert torch.equal(b["big"][:, -1], b["n"].to(torch.int32))
                name = shm_mapping(b["big"], maker=pid)
                if b["big"].nbytes >= SPILL_BYTES:
                    assert name is not None and name.startswith(f"aioloader-{pid}-s")
                    names.append(name)
                else:
                    assert name is None  # smaller: cheaper pickled
                assert shm_mapping(b["n"], maker=pid) is None
            if kept is None:  # the first batch is held to the end: its segment is never reused
                kept = batches[0]
                snapshot = kept["big"].clone()
            del batches, b
            gc.collect()
        assert len(names) == 8 and len(set(names)) < len(names)  # reused
        assert names.count(names[0]) == 1  # ... but never the held batch's
        assert torch.equal(kept["big"], snapshot)
        deadline = time.monotonic() + 10  # R lines travel back to the loader process
        while len(spilled(pid)) > loader.config.delivery.prefetch + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(spilled(pid)) <= loader.config.delivery.prefetch + 3  # kept for reuse, and the held one
    assert is_gone(pid)
    assert torch.equal(kept["big"], snapshot)  # held batches stay valid after close
    del kept
    gc.collect()
    assert slab_mappings() == []


def _intra_op_threads(samples: list[Any]) -> torch.Tensor:
    return torch.tensor([torch.get_num_threads()] * len(samples))


def test_collate_runs_with_one_intra_op_thread(numbered: list[str]) -> None:
    """The loader process is a fork of a trainer whose OpenMP pool may be running: a
    parallel torch op there would wait forever for threads the fork did not copy."""
    torch.ones(1 << 22).add_(1)  # this process's pool is up
    with Loader(
        numbered, batch_size=8, decode=decode_number, collate=_intra_op_threads, num_workers=1
    ) as loader:
        assert {int(v) for b in loader for v in b} == {1}
        assert loader.runtime == "process"


def test_without_a_zygote_it_loads_in_process_and_says_so(tmp_path: Path, numbered: list[str]) -> None:
    """A process whose first loader starts while an ``aioloader-*`` thread already runs
    cannot fork a zygote (module docstring of aioloader.procs.zygote): the loader runs in
    the trainer's process, with a warning, and still loads everything."""
    script = tmp_path / "no_zygote.py"
    script.write_text(
        "import logging, threading, time\n"
        "from helpers import decode_number\n"
        "from aioloader import Loader\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "threading.Thread(target=time.sleep, args=(30,), name='aioloader-other', daemon=True).start()\n"
        f"paths = {numbered!r}\n"
        "if __name__ == '__main__':\n"
        "    with Loader(paths, batch_size=5, decode=decode_number, shuffle=False, num_workers=1,\n"
        "                loader_process=True) as loader:\n"
        "        print(sorted(int(v) for b in loader for v in b) == list(range(len(paths))))\n"
        "        print(any(t.name == 'aioloader-loop' for t in threading.enumerate()))\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=script_env(), timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]  # all samples; the loop runs here
    assert "no zygote can be made" in out.stderr and "loading in-process" in out.stderr


KILLED_WITH_DEVSHM_SLABS = """
import os, signal
from helpers import number_image, shm_entries
from test_loader_process import loader_pid
from aioloader import Loader, LoaderError

paths = {paths!r}
if __name__ == "__main__":
    with Loader(paths, batch_size=4, decode=number_image, num_workers=1, prefetch=1, shuffle=False,
                loader_process=True) as loader:
        it = iter(loader)
        held = next(it)
        pid = loader_pid()
        made = sorted(n for n, maker in shm_entries().items() if maker == pid)
        print("made", *sorted({{n.split("-")[0] for n in made}}), flush=True)
        os.kill(pid, signal.SIGKILL)
        try:
            for _ in it:
                pass
        except LoaderError:
            pass
    print("left", sorted(n for n, maker in shm_entries().items() if maker == pid), flush=True)
    print("held", *held[:, 0, 0, 0].tolist(), flush=True)  # its mapping outlives the name
"""


def test_a_killed_loader_process_leaves_no_devshm_slab(tmp_path: Path, numbered: list[str]) -> None:
    """With ``/dev/shm`` slabs (``AIOLOADER_SLABS=devshm``, in a script of its own, whose
    exit shows what the resource tracker finds), a killed loader process leaves its slabs and
    semaphores as names in /dev/shm; the trainer removes them when it closes the loader, not
    when it exits (the resource tracker's time), and a batch it holds stays readable."""
    script = tmp_path / "killed_devshm.py"
    script.write_text(KILLED_WITH_DEVSHM_SLABS.format(paths=numbered))
    env = {**script_env(), "AIOLOADER_SLABS": "devshm"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["made aioloader sem.mp", "left []", "held 0 1 2 3"], out.stdout
    assert "leaked" not in out.stderr, out.stderr  # the resource tracker found nothing at exit


LOADER = "aioloader-loop"  # /proc/<pid>/comm: the loader process


def test_by_default_a_loader_runs_in_a_loader_process(numbered: list[str]) -> None:
    """No ``loader_process`` argument: the pipeline runs in an ``aioloader-loop`` process
    of this process's tree, the trainer's process keeps only the bridge, and ``runtime``
    says so."""
    loader = Loader(numbered, batch_size=5, decode=decode_number, num_workers=1, shuffle=False)
    assert loader.runtime is None and named(LOADER) == set()
    with loader:
        assert loader.runtime == "process"
        got = []
        for batch in loader:
            got.append([int(v) for v in batch])
            (pid,) = named(LOADER)  # while it loads
            assert pid == loader_pid()
            assert not any(t.name == "aioloader-loop" for t in threading.enumerate())
    assert got == [list(range(i, min(i + 5, 37))) for i in range(0, 37, 5)]
    assert loader.runtime == "process" and is_gone(pid)


NO_ZYGOTE_SCRIPT = """
import logging, threading
from helpers import decode_number
from aioloader import Loader

records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)


if __name__ == "__main__":
    shown = logging.StreamHandler()
    shown.setLevel(logging.WARNING)  # stderr shows warnings only, the DEBUG lines are kept
    logging.basicConfig(handlers=[shown])
    logging.getLogger("aioloader").addHandler(Keep(logging.DEBUG))
    logging.getLogger("aioloader").setLevel(logging.DEBUG)
    paths = {paths!r}
    # A real loader in this process, before any zygote: no decode pool and, with a
    # sample_timeout, no reader processes (so it never asks for one), but its aioloader-loop,
    # -transfer and -collate threads run while it is open, and a zygote forked now could copy
    # a lock one of them holds.
    with Loader(paths, batch_size=37, decode=None, loader_process=False, sample_timeout=30) as first:
        assert len(next(iter(first))) == 37
        cases = {{
            "default": {{}},
            "True": {{"loader_process": True}},
            "obstore": {{"storage_backend": "obstore"}},
        }}
        for case, kw in cases.items():
            records.clear()
            with Loader(paths, batch_size=5, decode=decode_number, shuffle=False, num_workers=1, **kw) as ld:
                got = [int(v) for b in ld for v in b]
                loop_threads = sum(t.name == "aioloader-loop" for t in threading.enumerate())
            said = [r.levelname for r in records if "no zygote can be made" in r.getMessage()]
            said += [f"{{r.levelname}}:{{r.getMessage()}}" for r in records if "obstore" in r.getMessage()]
            print(case, ld.runtime, got == list(range(len(paths))), loop_threads, *said, flush=True)
"""


def test_where_no_zygote_can_be_made_auto_loads_in_process_silently_and_true_warns(
    tmp_path: Path, numbered: list[str]
) -> None:
    """A process whose aioloader threads already run when a loader would fork its zygote
    (aioloader.procs.zygote): the default, ``"auto"``, loads in-process with a DEBUG line
    and no warning; ``loader_process=True`` loads in-process with a WARNING. Each delivers
    every sample, on a second ``aioloader-loop`` thread beside the first loader's. obstore,
    asked for by name, reads only in a loader process: fsspec reads instead, with a WARNING."""
    script = tmp_path / "no_zygote_auto.py"
    script.write_text(NO_ZYGOTE_SCRIPT.format(paths=numbered))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=script_env(), timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "default thread True 2 DEBUG",
        "True thread True 2 WARNING",
        "obstore thread True 2 DEBUG "
        "WARNING:storage_backend='obstore' needs a loader process: reading with fsspec",
    ]
    warnings = [line for line in out.stderr.splitlines() if "no zygote can be made" in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING:aioloader:loader_process=True: ")


def wide_number(data: bytes) -> np.ndarray:
    """64 KiB of the file's number: a batch of 16 is 1 MiB, large enough to be spilled."""
    return np.full(1 << 16, int(decode_number(data)[0]) % 256, dtype=np.uint8)


def _spill_maps(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as f:
        return {line.split(maxsplit=5)[5].strip() for line in f if f"aioloader-{pid}-s" in line}


def test_the_first_batches_are_slab_views_too(numbered: list[str]) -> None:
    """The first batch starts before the slabs' layout is known: its probe sample comes back
    pickled and teaches it, the rest decode into a slab's rows, and the probe's sample is
    written into row 0. So every batch crosses from the loader process as a slab view, and
    no spill segment (a batch of memory) is ever made."""
    with Loader(numbered * 6, batch_size=16, decode=wide_number, num_workers=1, shuffle=False) as loader:
        it = iter(loader)
        first = next(it)
        pid = loader_pid()
        name = shm_mapping(first, pid)
        assert name is not None and f"aioloader-{pid}-s" not in name  # a slab, not a spill
        assert int(first[0, 0]) == 0
        del first
        rest = []
        for b in it:
            assert shm_mapping(b, pid) is not None
            rest.append(int(b[0, 0]))
        assert rest == [n % 37 for n in range(16, 222, 16)]
        assert _spill_maps(pid) == set()
