"""The crash harness: a training script, killed at a chosen moment, and what it leaves.

:func:`run_case` starts a trainer (aioloader's ``Loader`` or, for comparison,
``torch.utils.data.DataLoader``; ``aioloader-process`` is aioloader with
``loader_process=True``; ``aioloader-forkserver`` is aioloader with its workers
from the stock fork server, as where no zygote can be made, and ``aioloader-thread`` one
started from a thread that has ended by the kill) in a session of its own, waits
until it reports the moment named by the phase, kills the trainer's process alone (as the
OOM killer or a scheduler's preemption does: its helpers are left to notice), and watches for up to ``limit``
seconds until no process of the session, no shared-memory slab of the trainer's pid (or
of a helper's that was alive when it was ready, such as a loader process: a ``/dev/shm``
segment, or a memfd slab any process on the machine still holds or maps) and
no new POSIX semaphore is left. Used by tests/test_crash.py (each case once) and
benchmarks/crash.py (each case N times, with times).

Phases (what the trainer is doing when it is killed):

- ``start``: just after ``with loader:``; the workers are still starting.
- ``mid-epoch``: iterating, with reads (10 ms each) and decodes (20 ms each) in flight.
- ``hung-decode``: blocked in ``next()`` while every worker is stuck in a decode.
- ``close``: inside ``close()``, which waits its grace period for the hung workers.
- ``held-batch``: holding a batch (zero-copy: its slab) and doing something else.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path

from helpers import memfd_holders, new_shm_entries, shm_segments, start_script

__all__ = ["KINDS", "PHASES", "Outcome", "run_case", "semaphores"]

PHASES = ("start", "mid-epoch", "hung-decode", "close", "held-batch")
KINDS = ("aioloader", "aioloader-process", "aioloader-forkserver", "aioloader-thread", "dataloader")

# Seconds between "ready" and the kill: into close() (which waits 2 s for hung workers),
# else at once.
_DELAY = {"close": 0.3}

TRAINER = """
import os, sys, threading, time
import numpy as np
from faults import Fault
from helpers import decode_number

KIND, PHASE, PATHS = {kind!r}, {phase!r}, {paths!r}
HUNG = set(range(4, len(PATHS)))  # the first batch decodes; every later sample hangs


def ready():
    print("ready", os.getpid(), flush=True)


def slow_read(path):
    time.sleep(0.01)
    with open(path, "rb") as f:
        return f.read()


def make():
    if PHASE in ("hung-decode", "close"):
        decode = Fault("hang", HUNG, seconds=3600)
    elif PHASE == "mid-epoch":
        decode = Fault("hang", set(range(len(PATHS))), seconds=0.02)
    else:
        decode = decode_number
    if KIND.startswith("aioloader"):
        import aioloader

        if KIND == "aioloader-forkserver":  # no zygote once a loader thread exists
            threading.Thread(target=time.sleep, args=(3600,), name="aioloader-other", daemon=True).start()

        read = slow_read if PHASE == "mid-epoch" else None
        return aioloader.Loader(
            PATHS,
            batch_size=4,
            decode=decode,
            num_workers=2,
            shuffle=False,
            read=read,
            loader_process=KIND == "aioloader-process",
        )
    import torch.utils.data

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return len(PATHS)

        def __getitem__(self, i):
            data = slow_read(PATHS[i]) if PHASE == "mid-epoch" else open(PATHS[i], "rb").read()
            return decode(data)

    return torch.utils.data.DataLoader(Files(), batch_size=4, num_workers=2, persistent_workers=True)


if __name__ == "__main__":
    loader = make()
    if KIND == "aioloader-thread":  # started (zygote forked) from a thread that then ends
        starter = threading.Thread(target=loader.start)
        starter.start()
        starter.join()
    elif KIND.startswith("aioloader"):
        loader.start()
    it = iter(loader)  # DataLoader starts its workers here
    if PHASE == "start":
        ready()
        time.sleep(3600)
    held = next(it)
    if PHASE == "held-batch":
        ready()
        time.sleep(3600)
    if PHASE == "close":
        ready()
        loader.close() if KIND.startswith("aioloader") else it._shutdown_workers()
        time.sleep(3600)
    ready()
    while True:  # mid-epoch: keep loading; hung-decode: blocks in here
        for batch in it:
            pass
        it = iter(loader)
"""


@dataclasses.dataclass
class Outcome:
    """What one kill left: ``survivors`` (pids still in the trainer's session), ``segments``
    (``/dev/shm/aioloader-<pid>-*``, and ``<holder pid>:aioloader-<pid>-*`` for a memfd slab
    a process still holds or maps), ``semaphores`` (POSIX semaphores made since the start:
    aioloader's, ``sem.mp-aioloader-<pid>-*``, of the trainer's session or of a process
    gone since; for ``dataloader``, any new one, since they carry no pid),
    after ``seconds`` (kill to clean, or to giving up at the limit); ``returncode`` of the
    trainer and its ``stderr``."""

    survivors: list[str]
    segments: set[str]
    semaphores: set[str]
    seconds: float
    returncode: int | None
    stderr: str

    @property
    def leaked(self) -> bool:
        return bool(self.survivors or self.segments or self.semaphores)


def semaphores() -> set[str]:
    """Named POSIX semaphores on this machine (``/dev/shm/sem.*``)."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("sem.")}
    except FileNotFoundError:
        return set()


def _session(session: int) -> list[str]:
    """Live processes of ``session``: a zombie has exited, and waits only for whoever
    adopted it (here, PID 1) to collect its status."""
    ps = ["ps", "-o", "pid=,stat=", "-s", str(session)]
    out = subprocess.run(ps, capture_output=True, text=True).stdout
    return [pid for pid, stat in (line.split() for line in out.splitlines()) if not stat.startswith("Z")]


def _kill_session(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_case(
    kind: str,
    phase: str,
    sig: signal.Signals,
    paths: list[str],
    folder: Path,
    limit: float = 5.0,
    repeat: int = 1,
) -> Outcome:
    """Run the trainer of ``kind`` to ``phase``, send ``sig`` to its process (``repeat``
    times, 50 ms apart, as an impatient scheduler or user does), and report what is left
    once everything is gone or ``limit`` seconds have passed."""
    sems_before = semaphores()
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    script = TRAINER.format(kind=kind, phase=phase, paths=paths)
    proc = start_script(folder / f"trainer_{kind}_{phase}.py", script)
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
    except BaseException:
        _kill_session(proc)
        raise
    if not line.startswith("ready"):
        _kill_session(proc)
        _, err = proc.communicate()
        raise AssertionError(f"the trainer did not get to {phase!r}: {line!r}\n{err}")
    # Segments carry their maker's pid: the trainer's, or its loader process's.
    makers = {proc.pid, *(int(p) for p in _session(proc.pid))}

    def segments() -> set[str]:
        return set().union(*(shm_segments(p) for p in makers)) | memfd_holders(makers)

    def new_semaphores() -> set[str]:
        # By the pid their names carry: a colleague's tests or a benchmark on the same
        # machine make semaphores meanwhile, and must neither count nor be removed.
        ours = {n for n in new_shm_entries(shm_before, makers) if n.startswith("sem.")}
        if kind == "dataloader":  # multiprocessing's own names carry no pid
            ours |= {n for n in semaphores() - sems_before if not n.startswith("sem.mp-aioloader-")}
        return ours

    try:
        time.sleep(_DELAY.get(phase, 0.0))
        os.kill(proc.pid, sig)
        killed = time.monotonic()
        for _ in range(repeat - 1):
            time.sleep(0.05)
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                break
        while True:
            proc.poll()  # reap the trainer: a zombie still counts for pgrep
            left = _session(proc.pid)
            segs = segments()
            sems = new_semaphores()
            seconds = time.monotonic() - killed
            if not (left or segs or sems) or seconds > limit:
                break
            time.sleep(0.01)
    finally:
        _kill_session(proc)  # a leaked helper keeps stdout and stderr open
        _, err = proc.communicate()
        for name in segments() | new_semaphores():  # leave the machine clean (memfds go alone)
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass
    return Outcome(left, segs, sems, seconds, proc.returncode, err)
