"""Nothing outlives a killed trainer: no process, no shared-memory segment, no semaphore.

The kill cases run real training scripts (tests/crashkit.py) and kill their process alone,
with SIGKILL and with SIGTERM, at five moments. benchmarks/crash.py runs the same cases many
times, with DataLoader beside them, and times them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from crashkit import PHASES, run_case, semaphores
from helpers import (
    decode_number,
    finish_script,
    is_gone,
    kill_session,
    new_shm_entries,
    script_env,
    session_survivors,
    shm_segments,
    start_script,
    write_numbered_files,
)

from aioloader import Loader
from aioloader.safety import lifeline, sigterm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_numbered_files(tmp_path_factory.mktemp("crash"), 64)


def _describe(outcome: object) -> str:
    return repr(outcome)[:3000]


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("kind", ["aioloader", "aioloader-process"])
def test_a_killed_trainer_leaves_nothing(
    files: list[str], tmp_path: Path, kind: str, phase: str, sig: signal.Signals
) -> None:
    """In-process, and with ``loader_process=True`` (the loader process and its workers
    follow the trainer too)."""
    outcome = run_case(kind, phase, sig, files, tmp_path)
    assert not outcome.leaked, _describe(outcome)
    assert outcome.returncode == -sig  # SIGTERM still ends the process by SIGTERM
    assert "Traceback" not in outcome.stderr, outcome.stderr
    if sig == signal.SIGTERM and phase != "close":
        # The handler closed the loader itself: the resource tracker, the safety net for
        # SIGKILL, found nothing left to clean. (Killed inside close() itself, the net
        # may catch what that close had not yet removed.)
        assert "leaked" not in outcome.stderr, outcome.stderr


@pytest.mark.parametrize("kind", ["aioloader", "aioloader-process"])
def test_sigterm_sent_again_while_closing_still_ends_the_trainer(
    files: list[str], tmp_path: Path, kind: str
) -> None:
    """A second SIGTERM arrives while the first one's handler waits for the loaders to close
    (hung workers: the close takes its grace period). The handler runs again on top of the
    first: it must not wait for the first (the same thread) for ever."""
    outcome = run_case(kind, "hung-decode", signal.SIGTERM, files, tmp_path, repeat=3)
    assert not outcome.leaked, _describe(outcome)
    assert outcome.returncode == -signal.SIGTERM
    assert "Traceback" not in outcome.stderr, outcome.stderr


@pytest.mark.parametrize("phase", ["mid-epoch", "hung-decode"])
@pytest.mark.parametrize("kind", ["aioloader-forkserver", "aioloader-thread"])
def test_without_the_zygote_or_from_a_thread_nothing_is_left(
    files: list[str], tmp_path: Path, kind: str, phase: str
) -> None:
    """Workers from the stock fork server (no zygote), and a zygote forked from a thread
    that has ended (so no parent-death signal for it: its pipe alone must do)."""
    outcome = run_case(kind, phase, signal.SIGKILL, files, tmp_path)
    assert not outcome.leaked, _describe(outcome)


# -- the lifelines, one at a time ---------------------------------------------------------------


def test_a_lifeline_pipe_ends_its_process_when_the_writer_is_gone() -> None:
    r, w = os.pipe()
    code = (
        "import sys, time; from aioloader.safety import lifeline; "
        "lifeline.exit_when_closed(int(sys.argv[1])); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(r)], pass_fds=[r], env=script_env())
    os.close(r)
    try:
        os.write(w, b"bytes on the pipe are not the end")
        time.sleep(0.5)
        assert proc.poll() is None
        os.close(w)
        assert proc.wait(timeout=10) == lifeline.ORPHANED
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


PARENT = """
import os, subprocess, sys, time
# The child asks to die with this process, then reports and sleeps.
code = (
    "import os, sys, time; from aioloader.safety import lifeline; "
    "print(lifeline.die_with_parent(int(sys.argv[1])), os.getpid(), flush=True); time.sleep(60)"
)
child = subprocess.Popen([sys.executable, "-c", code, str(os.getpid())])
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_kernel_kills_a_helper_whose_parent_dies(tmp_path: Path) -> None:
    proc = start_script(tmp_path / "parent.py", PARENT)
    try:
        assert proc.stdout is not None
        asked, child = proc.stdout.readline().split()
        assert asked == "True"
        os.kill(proc.pid, signal.SIGKILL)  # the parent alone
        deadline = time.monotonic() + 5
        while not is_gone(int(child)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert is_gone(int(child))
    finally:
        kill_session(proc)
    assert session_survivors(proc.pid) == []


def test_semaphores_carry_the_pid_and_go_with_the_loader(files: list[str]) -> None:
    tag = f"sem.mp-aioloader-{os.getpid()}-"
    before = {n for n in semaphores() if n.startswith(tag)}
    # In-process: the decode pool, and so its semaphores, are this process's.
    with Loader(files, batch_size=8, decode=decode_number, num_workers=1, loader_process=False) as loader:
        assert len(next(iter(loader))) == 8
        ours = {n for n in semaphores() if n.startswith(tag)} - before
        assert len(ours) == 5  # the executor's call queue (3) and result queue (2)
    assert not ({n for n in semaphores() if n.startswith(tag)} - before)


# -- SIGTERM: close, then die of it, unless the user decides -------------------------------------


def _signal_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "aioloader-signals"]


def _wakeup_fd() -> int:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def test_the_sigterm_handler_is_ours_only_while_a_loader_is_open(files: list[str]) -> None:
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with Loader(files, batch_size=8, decode=None) as loader:
        assert signal.getsignal(signal.SIGTERM) is sigterm._on_sigterm
        # The watcher that handles it when the main thread is stuck in a blocking call.
        assert _signal_threads() == ["aioloader-signals"] and _wakeup_fd() != -1
        with Loader(files, batch_size=8, decode=None):
            pass
        assert signal.getsignal(signal.SIGTERM) is sigterm._on_sigterm  # one still open
        assert len(next(iter(loader))) == 8
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert _signal_threads() == [] and _wakeup_fd() == -1


@pytest.mark.asyncio
async def test_async_with_installs_and_removes_it_on_the_callers_thread(files: list[str]) -> None:
    async with Loader(files, batch_size=8, decode=None) as loader:
        assert signal.getsignal(signal.SIGTERM) is sigterm._on_sigterm
        assert len([b async for b in loader]) == 8
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and _signal_threads() == []


def test_an_existing_wakeup_fd_is_left_alone(files: list[str]) -> None:
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    try:
        with Loader(files, batch_size=8, decode=None):
            assert signal.getsignal(signal.SIGTERM) is sigterm._on_sigterm
            assert _wakeup_fd() == w and _signal_threads() == []
        assert _wakeup_fd() == w
    finally:
        signal.set_wakeup_fd(-1)
        os.close(r)
        os.close(w)


def test_a_users_sigterm_handler_is_never_replaced_or_removed(files: list[str]) -> None:
    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not called in this test")

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with Loader(files, batch_size=8, decode=None):
            assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with Loader(files, batch_size=8, decode=None):
            signal.signal(signal.SIGTERM, mine)  # installed while the loader is open
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_loader_started_on_another_thread_leaves_sigterm_alone(files: list[str]) -> None:
    loader = Loader(files, batch_size=8, decode=None)
    starter = threading.Thread(target=loader.start)
    starter.start()
    starter.join()
    try:
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert len(next(iter(loader))) == 8
    finally:
        loader.close()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


USER_HANDLER = """
import signal, sys, time
import aioloader
from helpers import decode_number


def on_term(signum, frame):
    print("user handler", flush=True)
    sys.exit(3)  # unwinds through `with`: the loader closes


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_term)
    with aioloader.Loader({paths!r}, batch_size=4, decode=decode_number, num_workers=2) as loader:
        for batch in loader:
            print("batch", flush=True)
            time.sleep(0.05)
"""


def test_sigterm_with_a_users_handler_does_what_the_user_says(files: list[str], tmp_path: Path) -> None:
    proc = start_script(tmp_path / "user_handler.py", textwrap.dedent(USER_HANDLER).format(paths=files))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "batch"
    os.kill(proc.pid, signal.SIGTERM)
    out, err = finish_script(proc)
    assert proc.returncode == 3 and "user handler" in out, err
    assert "leaked" not in err and "Traceback" not in err, err
    assert session_survivors(proc.pid) == []
    assert shm_segments(proc.pid) == set()


SELF_DESTRUCT = """
import ctypes, os, sys
import aioloader
from faults import Fault

if __name__ == "__main__":
    decode = Fault("hang", set(range(8, 64)), seconds=3600)  # decodes in flight, some hung
    loader = aioloader.Loader({paths!r}, batch_size=4, decode=decode, num_workers=2, shuffle=False)
    it = iter(loader)
    held = next(it)
    if sys.argv[1] == "exit":
        os._exit(3)
    ctypes.string_at(0)  # SIGSEGV
"""


@pytest.mark.parametrize("how", ["exit", "segfault"])
def test_a_trainer_that_ends_itself_leaves_nothing(files: list[str], tmp_path: Path, how: str) -> None:
    path = tmp_path / "self_destruct.py"
    path.write_text(textwrap.dedent(SELF_DESTRUCT).format(paths=files))
    sems_before = semaphores()

    def left_semaphores() -> set[str]:
        """New ones of the trainer (gone) or of a process gone since: not a colleague's."""
        return {n for n in new_shm_entries(sems_before, {proc.pid}) if n.startswith("sem.")}

    proc = subprocess.Popen(
        [sys.executable, str(path), how],
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        proc.wait(timeout=60)
        assert proc.returncode == (3 if how == "exit" else -signal.SIGSEGV)
        assert session_survivors(proc.pid) == []
        deadline = time.monotonic() + 5
        while (shm_segments(proc.pid) or left_semaphores()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert shm_segments(proc.pid) == set() and left_semaphores() == set()
    finally:
        kill_session(proc)
