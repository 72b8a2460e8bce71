"""Each loader's helpers run with the trainer's environment as it is when that loader starts
(DESIGN.md, "The trainer's environment"): a variable set, changed or removed after an
earlier loader started is seen as it is now, by the decode workers (both runtimes), the
loader process and reader processes. The zygote, forked before the first test (conftest.py),
holds the environment of that moment, so every case here is the one a notebook meets: a
cell exports a token after a first loader ran, and the next loader must see it."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import RuntimeWatch, finish_script, start_script

from aioloader import Loader
from aioloader.procs import forking, zygote

SET, CHANGED, REMOVED = "AIOLOADER_TEST_SET", "AIOLOADER_TEST_CHANGED", "AIOLOADER_TEST_REMOVED"
NAMES = (SET, CHANGED, REMOVED)


@pytest.fixture(params=[False, True], ids=["thread", "process"])
def loader_process(request: pytest.FixtureRequest, runtimes: RuntimeWatch) -> bool:
    runtimes.expect(bool(request.param))
    return bool(request.param)


@pytest.fixture
def changed_environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    """The three kinds of change, made after the zygote was forked (before the first test)
    with the old values in place: what every helper must see now."""
    assert zygote.pid() is not None
    monkeypatch.setenv(SET, "new")
    monkeypatch.setenv(CHANGED, "after")
    monkeypatch.delenv(REMOVED, raising=False)
    return {SET: "new", CHANGED: "after", REMOVED: None}


def environment_of_worker(data: bytes) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in NAMES}


def environment_of_loader(samples: list[Any]) -> list[Any]:
    """A collate: runs where the loader's loop does (the loader process, or the trainer's
    process in-process); it passes each worker's view on with its own."""
    here = {name: os.environ.get(name) for name in NAMES}
    return [(sample, here) for sample in samples]


def test_decode_workers_and_the_loader_process_see_the_environment_of_now(
    numbered: list[str], loader_process: bool, changed_environment: dict[str, str | None]
) -> None:
    kw: dict[str, Any] = {"batch_size": 4, "num_workers": 2, "shuffle": False}
    kw["loader_process"] = loader_process
    with Loader(numbered[:8], decode=environment_of_worker, collate=environment_of_loader, **kw) as loader:
        batches = list(loader)
    pairs = [pair for batch in batches for pair in batch]
    assert len(pairs) == 8
    assert all(worker == changed_environment and here == changed_environment for worker, here in pairs)


def test_a_second_loader_sees_what_changed_after_the_first(
    numbered: list[str], loader_process: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process, two loaders, the environment changed between them (a cell run again)."""
    kw: dict[str, Any] = {"batch_size": 4, "num_workers": 1, "shuffle": False, "collate": list}
    kw["loader_process"] = loader_process
    monkeypatch.setenv(CHANGED, "first")
    monkeypatch.setenv(REMOVED, "there")
    with Loader(numbered[:4], decode=environment_of_worker, **kw) as loader:
        (first,) = list(loader)
    monkeypatch.setenv(CHANGED, "second")
    monkeypatch.delenv(REMOVED)
    monkeypatch.setenv(SET, "new")
    with Loader(numbered[:4], decode=environment_of_worker, **kw) as loader:
        (second,) = list(loader)
    assert first == [{SET: None, CHANGED: "first", REMOVED: "there"}] * 4
    assert second == [{SET: "new", CHANGED: "second", REMOVED: None}] * 4


def _report(conn: Any) -> None:
    conn.send({name: os.environ.get(name) for name in NAMES})
    conn.close()


def test_every_process_the_zygote_forks_takes_the_environment_of_now(
    changed_environment: dict[str, str | None],
) -> None:
    """The one path every helper comes by (the reader processes' too): a process of the
    zygote's context runs with the asking process's environment, not the zygote's."""
    ctx = zygote.context()
    assert ctx is not None
    ours, theirs = mp.Pipe()
    proc = ctx.Process(target=_report, args=(theirs,))
    proc.start()
    theirs.close()
    try:
        assert ours.poll(30)
        assert ours.recv() == changed_environment
    finally:
        proc.join(30)
        ours.close()


def test_follow_environ_sets_changes_and_removes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHANGED, "before")
    monkeypatch.setenv(REMOVED, "there")
    monkeypatch.delenv(SET, raising=False)
    wanted = {k: v for k, v in os.environ.items() if k != REMOVED} | {SET: "new", CHANGED: "after"}
    forking.follow_environ(wanted)
    assert dict(os.environ) == wanted
    # C code sees it too: getenv through the C library, not Python's copy.
    import ctypes

    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    assert libc.getenv(SET.encode()) == b"new" and libc.getenv(REMOVED.encode()) is None


SCRIPT = """
import os
from aioloader import Loader

def env(data):
    return os.environ.get("AIOLOADER_TOKEN", "<unset>")  # a str: batches are lists of them

if __name__ == "__main__":
    paths = {paths!r}
    for token in ("first", "second", None):
        if token is None:
            del os.environ["AIOLOADER_TOKEN"]
        else:
            os.environ["AIOLOADER_TOKEN"] = token
        with Loader(paths, batch_size=2, decode=env, num_workers=1, shuffle=False) as loader:
            print(*[v for batch in loader for v in batch])
"""


def test_a_script_that_exports_a_token_between_loaders(numbered: list[str], tmp_path: Path) -> None:
    """The way users run it: a script, the default runtime, ``os.environ[...] =`` between
    loaders (the first loader forks the zygote, with the first value)."""
    proc = start_script(tmp_path / "export_token.py", SCRIPT.format(paths=numbered[:2]))
    out, err = finish_script(proc)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["first first", "second second", "<unset> <unset>"]
